"""``GET /.well-known/agent`` and ``GET /agent/tools``: documents serialized once per catalog
version, with a strong ETag and conditional requests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from api.calling.catalog import Catalog, Document
from api.http.paths import root

CATALOG_MAX_AGE_S = 60  # how long a client may use the catalog without asking again (MCP's ttlMs too)
CACHE_CONTROL = f"private, max-age={CATALOG_MAX_AGE_S}"


def etag_matches(header: str, etag: str) -> bool:
    """``If-None-Match``: a comma list; ``*`` matches anything; a ``W/`` prefix is ignored."""
    for candidate in header.split(","):
        candidate = candidate.strip()
        if candidate == "*":
            return True
        if candidate.startswith("W/"):
            candidate = candidate[2:]
        if candidate == etag:
            return True
    return False


def serve(document: Document, request: Request) -> Response:
    headers = {"etag": document.etag, "cache-control": CACHE_CONTROL, "content-type": "application/json"}
    condition = request.headers.get("if-none-match")
    if condition is not None and etag_matches(condition, document.etag):
        return Response(status_code=304, headers=headers)
    return Response(document.body, headers=headers)


Endpoint = Callable[[Request], Awaitable[Response]]


def endpoints(catalog: Catalog) -> tuple[Endpoint, Endpoint]:
    # async: a plain def would be sent to a thread pool for a dictionary lookup.
    async def discovery(request: Request) -> Response:
        return serve(catalog.view.discovery_under(root(request.scope)), request)

    async def tools(request: Request) -> Response:
        return serve(catalog.view.catalog, request)

    return discovery, tools
