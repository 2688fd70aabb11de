"""A small shop: the example tools served by ``python -m carmy_worker examples.shop``.

Orders live in a dict of this process, to keep the example self-contained; a real tool would
talk to a database and use ``ctx.request_id`` or ``ctx.execution_id`` as its own idempotency key.
"""

from __future__ import annotations

import asyncio
import itertools

import msgspec

from carmy_worker import Context, Toolbox, ToolError

tools = Toolbox()


class Product(msgspec.Struct):
    sku: str
    name: str
    price_cents: int
    stock: int


CATALOG: dict[str, Product] = {
    p.sku: p
    for p in (
        Product("KB-01", "Mechanical keyboard", 8900, 12),
        Product("MS-02", "Wireless mouse", 2900, 40),
        Product("MN-27", "27-inch monitor", 24900, 3),
        Product("CB-10", "USB-C cable", 900, 200),
    )
}


class SearchInput(msgspec.Struct):
    query: str
    limit: int = 10


class SearchOutput(msgspec.Struct):
    results: list[Product]


class GetProductInput(msgspec.Struct):
    sku: str


class CreateOrderInput(msgspec.Struct):
    sku: str
    quantity: int = 1


class Order(msgspec.Struct):
    order_id: int
    sku: str
    quantity: int
    status: str


class CancelOrderInput(msgspec.Struct):
    order_id: int


ORDERS: dict[int, Order] = {}
_order_ids = itertools.count(1)


@tools.tool(effect="read", idempotent=True, parallel_safe=True, timeout=5)
async def search_products(ctx: Context, input: SearchInput) -> SearchOutput:
    """Search the catalog by name or SKU (case-insensitive)."""
    needle = input.query.lower()
    matches = [p for p in CATALOG.values() if needle in p.name.lower() or needle in p.sku.lower()]
    ctx.progress(len(matches), total=len(CATALOG), message="searched the catalog")
    return SearchOutput(results=matches[: max(input.limit, 0)])


@tools.tool(effect="read", idempotent=True, parallel_safe=True, timeout=5)
def get_product(ctx: Context, input: GetProductInput) -> Product:
    """Get one product by SKU."""
    product = CATALOG.get(input.sku)
    if product is None:
        raise ToolError("PRODUCT_NOT_FOUND", f"No product with SKU {input.sku!r}.", category="not_found",
                        recoverable=True, suggested_action="search_products")
    return product


@tools.tool(effect="write", timeout=10)
async def create_order(ctx: Context, input: CreateOrderInput) -> Order:
    """Place an order for a product. Not idempotent: send a request_id to retry safely."""
    product = CATALOG.get(input.sku)
    if product is None:
        raise ToolError("PRODUCT_NOT_FOUND", f"No product with SKU {input.sku!r}.", category="not_found",
                        recoverable=True, suggested_action="search_products")
    if not 0 < input.quantity <= product.stock:
        raise ToolError("OUT_OF_STOCK", f"Only {product.stock} of {input.sku} in stock.", category="conflict",
                        recoverable=True, details={"available": product.stock})
    ctx.progress(1, total=2, message="stock reserved")
    await asyncio.sleep(0)  # where a real shop would call its payment provider
    product.stock -= input.quantity
    order = Order(order_id=next(_order_ids), sku=input.sku, quantity=input.quantity, status="placed")
    ORDERS[order.order_id] = order
    ctx.progress(2, total=2, message="order placed")
    return order


@tools.tool(effect="destructive", idempotent=True, timeout=10)
async def cancel_order(ctx: Context, input: CancelOrderInput) -> Order:
    """Cancel an order. Destructive: the caller needs the permission confirm:cancel_order."""
    order = ORDERS.get(input.order_id)
    if order is None:
        raise ToolError("ORDER_NOT_FOUND", f"No order {input.order_id}.", category="not_found")
    if order.status != "cancelled":
        order.status = "cancelled"
        CATALOG[order.sku].stock += order.quantity
    return order
