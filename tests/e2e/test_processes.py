"""End to end over real HTTP: `python -m api` and `python -m carmy_worker` processes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.sse import parse
from tests.support import Stack, wait_until


@pytest.fixture(scope="module")
def base(stack: Stack) -> Iterator[str]:
    stack.worker("examples.shop")
    stack.worker("examples.shop")
    _, url = stack.api({"CARMY_SERVER_NAME": "shop"})
    wait_until(lambda: len(httpx.get(url + "/agent/tools").json()["tools"]) == 4)
    yield url


def test_discovery_over_http(base: str) -> None:
    r = httpx.get(base + "/.well-known/agent")
    assert r.status_code == 200
    assert r.json()["server"] == "shop"
    assert "server" not in r.headers  # no server banner
    assert [t["name"] for t in httpx.get(base + "/agent/tools").json()["tools"]] == [
        "cancel_order", "create_order", "get_product", "search_products"]


def test_shop_flow_json(base: str) -> None:
    with httpx.Client(base_url=base) as c:
        found = c.post("/agent/execute", json={"tool": "search_products", "arguments": {"query": "mouse"}})
        assert found.status_code == 200
        assert [p["sku"] for p in found.json()["data"]["results"]] == ["MS-02"]
        missing = c.post("/agent/execute", json={"tool": "get_product", "arguments": {"sku": "ZZ"}})
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "PRODUCT_NOT_FOUND"
        order = c.post("/agent/execute", json={"tool": "create_order", "arguments": {"sku": "MS-02"},
                                               "request_id": "order-1"})
        assert order.status_code == 200
        assert order.json()["_agent"]["cacheable"] is False
        cancel = c.post("/agent/execute", json={"tool": "cancel_order", "arguments": {"order_id": 1}})
        assert cancel.status_code == 403
        assert cancel.json()["error"]["code"] == "CONFIRMATION_REQUIRED"


def test_sse_streams_over_http(base: str) -> None:
    with httpx.Client(base_url=base) as c, c.stream(
        "POST", "/agent/execute", json={"tool": "create_order", "arguments": {"sku": "CB-10", "quantity": 2}},
        headers={"accept": "text/event-stream"},
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    events = parse(text)
    assert [n for n, _ in events] == ["execution.started", "tool.started", "tool.progress", "tool.progress",
                                      "tool.completed", "execution.completed"]
    assert events[-1][1]["data"]["quantity"] == 2


def test_latency_is_not_arqs_poll(base: str) -> None:
    # Not a benchmark: a guard that dispatch does not wait for arq's 0.5 s poll.
    with httpx.Client(base_url=base) as c:
        c.post("/agent/execute", json={"tool": "search_products", "arguments": {"query": "x"}})
        start = time.monotonic()
        for _ in range(10):
            assert c.post("/agent/execute", json={"tool": "search_products",
                                                  "arguments": {"query": "x"}}).status_code == 200
        assert (time.monotonic() - start) / 10 < 0.25
