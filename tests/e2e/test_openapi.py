"""An HTTP API served as tools by ``python -m carmy_worker --openapi URL --base-url URL``: real
API and worker processes, and a real upstream on 127.0.0.1 (``tests/openapi_upstream.py``) whose
own document the worker reads at start. Over HTTP and over MCP: a GET tool runs and is cacheable,
a DELETE tool asks for confirmation, a POST retried with its request_id reaches the upstream
once, and a 429 upstream tells the agent when to retry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from carmy_worker import AgentContext, Context
from carmy_worker.openapi.upstream import idempotency_key
from tests.api.test_mcp import connect, error_of
from tests.openapi_upstream import TOKEN, Upstream, upstream
from tests.support import Proc, Stack, wait_until

AGENT = "agent-key-0123456789"  # may confirm deleteItem
INTERN = "intern-key-0123456789"  # may not
KEYS = json.dumps({AGENT: {"principal": "agent", "permissions": ["confirm:deleteItem"]},
                   INTERN: {"principal": "intern", "permissions": []}})


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[Upstream]:
    with upstream() as u:
        yield u


@pytest.fixture(scope="module")
def worker(stack: Stack, api: Upstream) -> Proc:
    return stack.worker(None, env={"CARMY_OPENAPI_BEARER_TOKEN": TOKEN},
                        args=("--openapi", api.url + "/openapi.json", "--base-url", api.url, "--timeout", "2"))


@pytest.fixture(scope="module")
def base(stack: Stack, worker: Proc) -> str:
    _, url = stack.api({"CARMY_API_KEYS": KEYS})
    return url


def call(base: str, tool: str, arguments: dict[str, Any], key: str = AGENT, **extra: Any) -> httpx.Response:
    return httpx.post(base + "/agent/execute", json={"tool": tool, "arguments": arguments, **extra},
                      headers={"authorization": f"Bearer {key}"}, timeout=30)


def test_the_catalog_lists_the_operations(base: str) -> None:
    tools = {t["name"]: t for t in httpx.get(base + "/agent/tools", headers={"authorization": f"Bearer {AGENT}"},
                                             timeout=10).json()["tools"]}
    assert "uploadPhoto" not in tools and len(tools) == 11  # multipart: skipped
    assert {k: tools["deleteItem"][k] for k in ("effect", "idempotent", "confirmation", "parallel_safe")} == {
        "effect": "destructive", "idempotent": False, "confirmation": "required", "parallel_safe": True}
    assert tools["getItem"]["input_schema"]["required"] == ["itemId"]


def test_a_get_tool_runs_and_is_cacheable_and_arguments_are_checked_first(base: str, api: Upstream) -> None:
    created = call(base, "createItem", {"body": {"name": "kettle", "price": 30}}).json()["data"]
    got = call(base, "getItem", {"itemId": created["id"]})
    assert got.status_code == 200, got.text
    assert got.json()["data"] == created and got.json()["_agent"]["cacheable"] is True
    assert api.requests("GET", f"/items/{created['id']}")[-1].headers["authorization"] == f"Bearer {TOKEN}"
    seen = len(api.seen)
    refused = call(base, "getItem", {"itemId": "x", "verbose": True})
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "INVALID_ARGUMENTS")
    assert len(api.seen) == seen  # the API refused it: the upstream never heard of it


def test_a_delete_tool_asks_for_confirmation(base: str, api: Upstream) -> None:
    created = call(base, "createItem", {"body": {"name": "vase"}}).json()["data"]
    refused = call(base, "deleteItem", {"itemId": created["id"]}, key=INTERN)
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "CONFIRMATION_REQUIRED")
    assert api.requests("DELETE", f"/items/{created['id']}") == []
    deleted = call(base, "deleteItem", {"itemId": created["id"]})
    assert (deleted.status_code, deleted.json()["data"]) == (200, None)
    gone = call(base, "getItem", {"itemId": created["id"]})
    assert (gone.status_code, gone.json()["error"]["code"]) == (404, "UPSTREAM_NOT_FOUND")


def test_a_retried_post_reaches_the_upstream_once(base: str, api: Upstream) -> None:
    first = call(base, "createItem", {"body": {"name": "once"}}, request_id="create-once")
    again = call(base, "createItem", {"body": {"name": "once"}}, request_id="create-once")
    assert first.status_code == again.status_code == 200
    assert again.json()["execution_id"] == first.json()["execution_id"]
    [seen] = [s for s in api.requests("POST", "/items") if json.loads(s.body) == {"name": "once"}]
    # The agent's principal makes the key a digest: another principal's "create-once" is another key.
    assert seen.headers["idempotency-key"] == _key("agent", "create-once")


def test_a_429_tells_the_agent_when_to_retry(base: str) -> None:
    limited = call(base, "rateLimited", {})
    assert limited.status_code == 429 and limited.headers["retry-after"] == "7"
    error = limited.json()["error"]
    assert (error["code"], error["retryable"], error["retry_after"]) == ("UPSTREAM_RATE_LIMITED", True, 7)
    assert limited.json()["_agent"]["next_actions"] == [
        {"action": "retry", "tool": "rateLimited", "same_request_id": False, "after_ms": 7000}]
    broken = call(base, "broken", {})
    assert (broken.status_code, broken.json()["error"]["code"]) == (503, "UPSTREAM_UNAVAILABLE")


def test_a_slow_upstream_times_out_and_its_request_is_aborted(base: str, api: Upstream) -> None:
    slow = call(base, "slow", {"seconds": 20})
    assert (slow.status_code, slow.json()["status"]) == (504, "timed_out")
    wait_until(lambda: "20" in api.aborted, 10, what="the upstream saw the worker leave")


def _key(principal: str, request_id: str) -> str:
    return idempotency_key(Context(execution_id="x", tool="t", request_id=request_id,
                                   agent=AgentContext(principal=principal), emit=lambda *_: None))


async def test_over_mcp(base: str, api: Upstream) -> None:
    async with connect(base + "/mcp", token=AGENT) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert tools["getItem"].annotations is not None
        assert tools["getItem"].annotations.model_dump(by_alias=True, exclude_none=True) == {
            "readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
        created = await client.call_tool("createItem", {"body": {"name": "mcp"}},
                                         meta={"carmy/request_id": "mcp-create"})  # type: ignore[arg-type]
        again = await client.call_tool("createItem", {"body": {"name": "mcp"}},
                                       meta={"carmy/request_id": "mcp-create"})  # type: ignore[arg-type]
        assert created.structured_content == again.structured_content
        assert again.meta is not None and again.meta["carmy/replayed"] is True
        assert len([s for s in api.requests("POST", "/items") if json.loads(s.body) == {"name": "mcp"}]) == 1
        item = created.structured_content
        assert item is not None
        got = await client.call_tool("getItem", {"itemId": item["id"]})
        assert got.structured_content == item
        limited = error_of(await client.call_tool("rateLimited", {}))
        assert (limited["code"], limited["retry_after"]) == ("UPSTREAM_RATE_LIMITED", 7)
    async with connect(base + "/mcp", token=INTERN) as client:
        refused = error_of(await client.call_tool("deleteItem", {"itemId": item["id"]}))
        assert refused["code"] == "CONFIRMATION_REQUIRED"
    assert api.requests("DELETE", f"/items/{item['id']}") == []


def test_zz_the_worker_stops_cleanly_closing_its_upstream_connections(base: str, worker: Proc) -> None:
    """Last: the worker that served every call above drains on SIGTERM and closes its pooled
    client (a failure there would be logged as an error)."""
    assert call(base, "text", {}).json()["data"] == "just words"  # a connection in the pool
    assert worker.stop(timeout=20) == 0
    assert worker.error_lines() == []
