"""MCP at /mcp with the SDK's own client, against the app served by uvicorn (a real server, so
that a client going away is a real disconnect), real Redis and a real worker.

Most tests run in both protocol eras the SDK speaks: ``legacy`` (the initialize handshake,
2025-11-25) and ``auto``, which negotiates the stateless 2026-07-28 protocol.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult
from redis.asyncio import Redis
from starlette.applications import Starlette

from api.app import create_app
from api.mcp.cancel import CallRegistry
from api.settings import ApiKey
from api.settings.quotas import Quotas
from carmy_worker.sdk.context import AgentContext
from carmy_worker.store import keys
from carmy_worker.store.quota import Quota
from tests import raw
from tests.support import Stack, app_settings, serving

MODES = ["legacy", "auto"]
TOKEN = "alice-token-0123456789"


@contextlib.contextmanager
def serving_mcp(app: Starlette) -> Iterator[str]:
    """The app under uvicorn (a real server, so that a client going away is a real disconnect);
    yields its /mcp URL."""
    with serving(app) as base:
        yield base + "/mcp"


@pytest.fixture(scope="module")
def url(stack: Stack) -> Iterator[str]:
    stack.worker()
    with serving_mcp(create_app(app_settings(stack.redis_url))) as u:
        yield u


@pytest.fixture(scope="module")
def other_url(stack: Stack, url: str) -> Iterator[str]:
    """A second API replica on the same Redis."""
    with serving_mcp(create_app(app_settings(stack.redis_url))) as u:
        yield u


@pytest.fixture(scope="module")
def keyed_url(stack: Stack, url: str) -> Iterator[str]:
    keys = {TOKEN: ApiKey(principal="alice", permissions=frozenset({"confirm:wipe"}))}
    with serving_mcp(create_app(app_settings(stack.redis_url, api_keys=keys))) as u:
        yield u


@contextlib.asynccontextmanager
async def connect(url: str, mode: str = "auto", token: str | None = None) -> AsyncIterator[Client]:
    headers = {"authorization": f"Bearer {token}"} if token else None
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(10, read=60)) as http, \
            Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        yield client


async def appears(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        await anyio.sleep(0.02)
    return path.exists()


def error_of(result: CallToolResult) -> dict[str, Any]:
    """The error object of a failed call, checking that the text and ``_meta`` agree. No
    ``structuredContent``: clients would check it against the tool's output schema."""
    assert result.is_error
    assert len(result.content) == 1 and result.content[0].type == "text"
    err: dict[str, Any] = json.loads(result.content[0].text)
    assert result.structured_content is None
    assert result.meta is not None and result.meta["carmy/execution_id"].startswith("exec_")
    assert result.meta["carmy/error"] == err
    return err


async def test_initialize_and_ping(url: str) -> None:
    async with connect(url, "legacy") as client:
        assert client.protocol_version == "2025-11-25"
        assert client.server_info is not None and client.server_info.name == "carmy"
        assert client.server_capabilities.tools is not None
        assert "carmy/request_id" in (client.instructions or "")
        await client.session.send_ping()


async def test_auto_negotiates_the_stateless_protocol(url: str) -> None:
    async with connect(url) as client:
        assert client.protocol_version == "2026-07-28"
        assert client.server_capabilities.tools is not None
        info = client.server_info
        assert info is not None and (info.name, info.title) == ("carmy", "Carmy")
        assert info.description is not None and "carmy/request_id" in info.description


async def test_titles_and_caching_on_the_stateless_protocol(url: str) -> None:
    async with connect(url) as client:
        listed = await client.list_tools()
    tools = {t.name: t for t in listed.tools}
    assert tools["words"].title == "Split into words"
    assert tools["echo"].title is None
    # As long as GET /agent/tools may be cached (Cache-Control: private, max-age=60).
    assert (listed.ttl_ms, listed.cache_scope) == (60000, "private")


@pytest.mark.parametrize(("mode", "structured"), [("legacy", False), ("auto", True)])
async def test_non_object_output(url: str, mode: str, structured: bool) -> None:
    """2026-07-28 allows any JSON value as structured content; earlier revisions objects only."""
    async with connect(url, mode) as client:
        words = {t.name: t for t in (await client.list_tools()).tools}["words"]
        result = await client.call_tool("words", {"text": "a b"})
    assert json.loads(result.content[0].text) == ["a", "b"]
    if structured:
        assert words.output_schema is not None and words.output_schema["type"] == "array"
        assert result.structured_content == ["a", "b"]
    else:
        assert words.output_schema is None and result.structured_content is None


@pytest.mark.parametrize("mode", MODES)
async def test_tools_list(url: str, mode: str) -> None:
    async with connect(url, mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert list(tools) == sorted(tools)

    wipe = tools["wipe"]
    assert wipe.annotations is not None
    assert wipe.annotations.model_dump(by_alias=True, exclude_none=True) == {
        "readOnlyHint": False, "destructiveHint": True, "idempotentHint": True, "openWorldHint": False}
    # A destructive tool always needs confirmation: its catalog says so, whatever it declared.
    assert wipe.meta == {"carmy/effect": "destructive", "carmy/confirmation": "required", "carmy/parallel_safe": False}

    echo = tools["echo"]
    assert echo.description == "Echo the text."
    assert echo.annotations is not None
    assert echo.annotations.model_dump(by_alias=True, exclude_none=True) == {
        "readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
    assert echo.meta == {"carmy/effect": "read", "carmy/confirmation": "none", "carmy/parallel_safe": True}
    assert echo.input_schema["type"] == "object"
    assert echo.input_schema["additionalProperties"] is False
    assert echo.output_schema is not None and echo.output_schema["type"] == "object"

    notify = tools["notify"]
    assert notify.annotations is not None
    assert notify.annotations.model_dump(by_alias=True, exclude_none=True) == {
        "readOnlyHint": False, "destructiveHint": False, "idempotentHint": False, "openWorldHint": True}
    assert notify.meta == {"carmy/effect": "external_write", "carmy/confirmation": "none",
                           "carmy/parallel_safe": False}

    assert tools["publish"].meta == {"carmy/effect": "write", "carmy/confirmation": "required",
                                     "carmy/parallel_safe": False}


@pytest.mark.parametrize("mode", MODES)
async def test_call_returns_structured_content_and_json_text(url: str, mode: str) -> None:
    async with connect(url, mode) as client:
        result = await client.call_tool("echo", {"text": "ab", "times": 2})
    assert not result.is_error
    assert result.structured_content == {"text": "abab"}
    assert len(result.content) == 1 and result.content[0].type == "text"
    assert json.loads(result.content[0].text) == {"text": "abab"}
    assert result.meta is not None
    assert result.meta["carmy/execution_id"].startswith("exec_")
    assert result.meta["carmy/replayed"] is False


async def test_tool_without_input(url: str) -> None:
    async with connect(url) as client:
        result = await client.call_tool("noop")
    assert not result.is_error and result.structured_content == {}


@pytest.mark.parametrize("mode", MODES)
async def test_tool_error_is_the_error_object(url: str, mode: str) -> None:
    async with connect(url, mode) as client:
        result = await client.call_tool("refuse")
    assert error_of(result) == {
        "code": "OUT_OF_STOCK", "message": "Nothing left.", "category": "conflict", "recoverable": True,
        "retryable": True, "retry_after": 7, "suggested_action": "wait", "details": {"sku": "KB-01"},
    }


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
async def test_timeout_is_a_tool_error(url: str, mode: str) -> None:
    async with connect(url, mode) as client:
        result = await client.call_tool("sleepy", {"seconds": 5, "tag": f"mcp-timeout-{mode}"})
    err = error_of(result)
    assert (err["code"], err["category"]) == ("TIMEOUT", "timeout")


async def test_confirmation_required(url: str) -> None:
    async with connect(url) as client:
        result = await client.call_tool("wipe")
    err = error_of(result)
    assert err["code"] == "CONFIRMATION_REQUIRED"
    assert err["category"] == "permission"


@pytest.mark.parametrize("mode", MODES)
async def test_unknown_tool_is_a_protocol_error(url: str, mode: str) -> None:
    async with connect(url, mode) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("no_such_tool", {})
    assert refused.value.error.code == -32602
    assert refused.value.error.message == "Unknown tool: no_such_tool"


@pytest.mark.parametrize(("arguments", "path"), [
    ({"text": 5}, "$.text"),
    ({"text": "a", "hallucinated": True}, "$"),
    ({}, "$"),
])
async def test_invalid_arguments(url: str, arguments: dict[str, Any], path: str) -> None:
    async with connect(url) as client:
        result = await client.call_tool("echo", arguments)
    err = error_of(result)
    assert err["code"] == "INVALID_ARGUMENTS"
    assert err["details"]["path"] == path


@pytest.mark.parametrize("mode", MODES)
async def test_progress_notifications_in_order(url: str, mode: str) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with connect(url, mode) as client:
        result = await client.call_tool("progress", {"n": 3}, progress_callback=on_progress)
    assert result.structured_content == {"n": 3}
    # The partial result that follows step 3 has no MCP counterpart: three notifications.
    assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_cancels_the_running_tool(url: str, stack: Stack, mode: str) -> None:
    tag = f"mcp-{mode}"
    async with connect(url, mode) as client:
        async with anyio.create_task_group() as calls:
            calls.start_soon(client.call_tool, "linger", {"seconds": 20, "tag": tag})
            assert await appears(stack.tmp / f"linger-start-{tag}", 30)
            calls.cancel_scope.cancel()
        # Still connected: the cancellation itself stopped the tool (else it runs 20 s), not the client leaving.
        assert await appears(stack.tmp / f"linger-cancelled-{tag}", 10)


@pytest.mark.parametrize("mode", MODES)
async def test_request_id_replays(url: str, stack: Stack, mode: str) -> None:
    name = f"mcp-replay-{mode}"
    meta: Any = {"carmy/request_id": f"order-{mode}"}
    async with connect(url, mode) as client:
        first = await client.call_tool("tally", {"name": name}, meta=meta)
        again = await client.call_tool("tally", {"name": name}, meta=meta)
        other = await client.call_tool("tally", {"name": name + "-other"}, meta=meta)
    assert first.structured_content == again.structured_content == {"n": 1}
    assert first.meta is not None and again.meta is not None
    assert again.meta["carmy/execution_id"] == first.meta["carmy/execution_id"]
    assert (first.meta["carmy/replayed"], again.meta["carmy/replayed"]) == (False, True)
    assert len((stack.tmp / f"tally-{name}").read_text().splitlines()) == 1
    assert error_of(other)["code"] == "IDEMPOTENCY_CONFLICT"


@pytest.mark.parametrize("request_id", [7, "", "x" * 257])
async def test_bad_request_id(url: str, request_id: Any) -> None:
    meta: Any = {"carmy/request_id": request_id}
    async with connect(url) as client:
        result = await client.call_tool("echo", {"text": "a"}, meta=meta)
    assert error_of(result)["code"] == "INVALID_ID"


# --- notifications/cancelled in a POST of its own (handshake versions), as plain HTTP --------

ACCEPT = {"accept": "application/json, text/event-stream"}


def rpc(method: str, params: dict[str, Any], id: int | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    return message if id is None else {**message, "id": id}


async def handshake(http: httpx.AsyncClient, url: str) -> dict[str, str]:
    """Initialize; the headers of the session's later requests."""
    r = await http.post(url, headers=ACCEPT, json=rpc("initialize", {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}, id=0))
    assert r.status_code == 200
    headers = {**ACCEPT, "mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    assert (await http.post(url, headers=headers, json=rpc("notifications/initialized", {}))).status_code == 202
    return headers


def call_error(response: httpx.Response) -> dict[str, Any]:
    """The error object in the JSON-RPC answer to a tools/call (an SSE stream or JSON)."""
    if response.headers["content-type"].startswith("text/event-stream"):
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:") and line[5:].strip()]
        message = json.loads(data[-1])
    else:
        message = response.json()
    result = message["result"]
    assert result["isError"] is True and "structuredContent" not in result
    err: dict[str, Any] = result["_meta"]["carmy/error"]
    assert json.loads(result["content"][0]["text"]) == err
    return err


async def test_cancelled_notification_at_another_replica(url: str, other_url: str, stack: Stack) -> None:
    tag = "mcp-replica"
    params = {"name": "linger", "arguments": {"seconds": 20, "tag": tag}, "_meta": {"carmy/request_id": tag}}
    async with httpx.AsyncClient(timeout=10) as http:
        headers = await handshake(http, url)
        async with http.stream("POST", url, headers=headers, json=rpc("tools/call", params, id=7)) as answer:
            assert await appears(stack.tmp / f"linger-start-{tag}", 30)
            # The call's stream stays open: only the notification, at the other replica, cancels it.
            cancel = rpc("notifications/cancelled", {"requestId": 7})
            assert (await http.post(other_url, headers=headers, json=cancel)).status_code == 202
            assert await appears(stack.tmp / f"linger-cancelled-{tag}", 10)  # else it runs 20 s
            await answer.aread()
        # The stream ends with no answer, as MCP says; the record says what happened, for a retry.
        assert answer.status_code == 200 and answer.text == ""
        retry = await http.post(url, headers=headers, json=rpc("tools/call", params, id=8))
    assert call_error(retry)["code"] == "CANCELLED"


async def test_cancelled_notification_before_its_call(url: str) -> None:
    tag = "mcp-overtaken"
    async with httpx.AsyncClient(timeout=10) as http:
        headers = await handshake(http, url)
        cancel = rpc("notifications/cancelled", {"requestId": 9})
        assert (await http.post(url, headers=headers, json=cancel)).status_code == 202
        call = rpc("tools/call", {"name": "linger", "arguments": {"seconds": 20, "tag": tag}}, id=9)
        started = time.monotonic()
        r = await http.post(url, headers=headers, json=call)
    assert time.monotonic() - started < 5
    assert r.status_code == 200 and r.text == ""


async def test_cancelled_retry_that_joined_gets_no_response(url: str, stack: Stack) -> None:
    """A retry joins the running execution; cancelling the retry leaves the execution to the call
    that started it, and the retry gets no answer."""
    tag = "mcp-joined"
    params = {"name": "gate", "arguments": {"tag": tag}, "_meta": {"carmy/request_id": tag}}
    async with httpx.AsyncClient(timeout=30) as http:
        headers = await handshake(http, url)
        async with http.stream("POST", url, headers=headers, json=rpc("tools/call", params, id=7)) as first:
            assert await appears(stack.tmp / f"gate-start-{tag}", 30)  # 7 started it: 8 can only join
            async with http.stream("POST", url, headers=headers, json=rpc("tools/call", params, id=8)) as retry:
                # Whether the cancellation comes before the join is recorded or after, it finds it.
                cancel = rpc("notifications/cancelled", {"requestId": 8})
                assert (await http.post(url, headers=headers, json=cancel)).status_code == 202
                (stack.tmp / f"gate-open-{tag}").touch()
                await retry.aread()
            await first.aread()
    assert json.loads(first.text.split("data:")[-1])["result"]["structuredContent"] == {"n": 1}
    assert retry.status_code == 200 and retry.text == ""
    assert not (stack.tmp / f"gate-cancelled-{tag}").exists()


async def test_a_cancelled_call_is_marked_for_as_long_as_it_may_run(stack: Stack) -> None:
    """The mark keeps the call's own TTL, so a call that runs past a minute still finds it."""
    redis = Redis.from_url(stack.redis_url)
    try:
        registry, agent = CallRegistry(redis), AgentContext()
        await redis.delete(keys.mcp_call(None, None, "s", "7"))
        await registry.remember(agent, "s", 7, "exec_x", "gate", 600, owner=True)
        assert await registry.cancelled(agent, "s", 7) == ("exec_x", "gate")
        assert await registry.is_cancelled(agent, "s", 7)
        assert 590 < await redis.ttl(keys.mcp_call(None, None, "s", "7")) <= 600
    finally:
        await redis.aclose()


async def test_no_server_stream(url: str) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        headers = await handshake(http, url)
        r = await http.get(url, headers=headers)
    assert r.status_code == 405


@pytest.mark.parametrize("version", [None, "2025-11-25", "2026-07-28"])
@pytest.mark.parametrize("body", [
    b'{"jsonrpc": "1.0", "id": 1, "method": "tools/list"}',
    b'{"jsonrpc": "2.0", "id": 1}',
    b'{"jsonrpc": "2.0", "id": 1, "method": 5}',
    b'[{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]',
    b'"tools/list"',
    b'{"jsonrpc": "2.0", "id": null, "method": "tools/list"}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": 5}',
])
async def test_malformed_json_rpc(url: str, body: bytes, version: str | None) -> None:
    headers = {**ACCEPT, "content-type": "application/json"} | ({"mcp-protocol-version": version} if version else {})
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(url, content=body, headers=headers)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == -32600
    assert "validation" not in r.text  # no internals


async def test_not_json(url: str) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(url, content=b'{"jsonrpc": ', headers={**ACCEPT, "content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == -32700


@pytest.mark.parametrize("version", [None, "2025-11-25", "2026-07-28"])
@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b'"\\ud800"'])
async def test_what_only_python_reads_as_json_is_not_json(url: str, version: str | None, value: bytes) -> None:
    """NaN, Infinity and a lone surrogate are not JSON, in arguments as anywhere else: not a
    call whose NaN became null, nor an internal error (a surrogate cannot be encoded again)."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    call = json.dumps(rpc("tools/call", {"name": "echo", "arguments": {"text": "VALUE"},
                                         **({"_meta": meta} if version == "2026-07-28" else {})}, id=1))
    headers = {**ACCEPT, "content-type": "application/json", "mcp-method": "tools/call", "mcp-name": "echo"} | (
        {"mcp-protocol-version": version} if version else {})
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(url, content=call.encode().replace(b'"VALUE"', value), headers=headers)
    assert (r.status_code, r.json()["error"]["code"]) == (400, -32700), r.text


@pytest.mark.parametrize("method", ["GET", "DELETE", "PUT"])
async def test_methods_other_than_post(url: str, method: str) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.request(method, url, headers=ACCEPT)
    assert r.status_code == 405
    assert r.headers["allow"] == "POST"


async def test_api_keys(keyed_url: str) -> None:
    async with httpx.AsyncClient() as http:
        r = await http.post(keyed_url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                            headers={"accept": "application/json, text/event-stream"})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "UNAUTHENTICATED"
    with pytest.raises(BaseExceptionGroup) as refused:
        async with connect(keyed_url, "legacy", token="wrong-token-0123456789"):
            pass
    assert refused.group_contains(MCPError, depth=None)

    async with connect(keyed_url, token=TOKEN) as client:
        who = await client.call_tool("whoami")
        wiped = await client.call_tool("wipe")  # the key grants confirm:wipe
    assert who.structured_content == {"principal": "alice", "session": None, "permissions": ["confirm:wipe"],
                                      "request_id": None}
    assert not wiped.is_error


def raw_post(url: str, body: bytes, headers: dict[str, str]) -> bytes:
    """A POST over a bare socket (httpx refuses to send a header value with spaces around it);
    the whole response."""
    base, _, path = url.removeprefix("http://").partition("/")
    lines = [f"POST /{path} HTTP/1.1", f"Host: {base}", "Connection: close", f"Content-Length: {len(body)}",
             *(f"{k}: {v}" for k, v in headers.items())]
    with raw.connect("http://" + base) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        return raw.until_closed(sock)[1]


async def test_routing_headers_are_read_without_surrounding_whitespace(url: str) -> None:
    """2026-07-28's Mcp-Method and Mcp-Name must match the body; spaces around a header's value
    are not part of it (RFC 9110)."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}
    call = json.dumps(rpc("tools/call", {"name": "echo", "arguments": {"text": "a"}, "_meta": meta}, id=1)).encode()
    headers = {**ACCEPT, "content-type": "application/json", "mcp-protocol-version": "2026-07-28",
               "mcp-method": "tools/call"}
    spaced = await anyio.to_thread.run_sync(raw_post, url, call, {**headers, "mcp-name": "  echo \t"})
    other = await anyio.to_thread.run_sync(raw_post, url, call, {**headers, "mcp-name": "echo_sync"})
    assert spaced.startswith(b"HTTP/1.1 200") and b'"isError":false' in spaced
    assert other.startswith(b"HTTP/1.1 400") and b"-32020" in other


# --- next_actions, order of checks, arguments and recoverable, as carmy/1 has them ----------


def next_actions(result: CallToolResult) -> list[dict[str, Any]]:
    """``_meta["carmy/next_actions"]``: the result body's ``_agent.next_actions``, sent when not empty."""
    assert result.meta is not None
    actions: list[dict[str, Any]] = result.meta.get("carmy/next_actions", [])
    assert actions != [] or "carmy/next_actions" not in result.meta
    return actions


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
async def test_next_actions_in_meta(url: str, mode: str) -> None:
    async with connect(url, mode) as client:
        confirm = await client.call_tool("wipe")
        refused = await client.call_tool("refuse")
        timed_out = await client.call_tool("sleepy", {"seconds": 5, "tag": f"mcp-next-{mode}"})
        invalid = await client.call_tool("echo", {"text": 5})
        done = await client.call_tool("echo", {"text": "a"})
    assert next_actions(confirm) == [
        {"action": "retry", "tool": "wipe", "same_request_id": True, "requires": "confirm:wipe"}]
    assert next_actions(refused) == [
        {"action": "retry", "tool": "refuse", "same_request_id": False, "after_ms": 7000}]
    assert next_actions(timed_out) == [{"action": "retry", "tool": "sleepy", "same_request_id": False}]
    assert next_actions(invalid) == [] and next_actions(done) == []


async def test_next_actions_of_a_conflict(url: str) -> None:
    meta: Any = {"carmy/request_id": "mcp-next-conflict"}
    async with connect(url) as client:
        assert not (await client.call_tool("echo", {"text": "a"}, meta=meta)).is_error
        other = await client.call_tool("echo", {"text": "b"}, meta=meta)
    assert error_of(other)["code"] == "IDEMPOTENCY_CONFLICT"
    assert next_actions(other) == [{"action": "retry", "tool": "echo", "same_request_id": False}]


@pytest.mark.parametrize(("name", "arguments", "request_id", "code"), [
    ("wipe", {}, "x" * 257, "CONFIRMATION_REQUIRED"),
    ("wipe", {"no": "such"}, 7, "CONFIRMATION_REQUIRED"),
    ("echo", {"text": 5}, "x" * 257, "INVALID_ID"),
    ("echo", {"text": 5}, 7, "INVALID_ID"),
])
async def test_order_of_checks(url: str, name: str, arguments: dict[str, Any], request_id: Any, code: str) -> None:
    meta: Any = {"carmy/request_id": request_id}
    async with connect(url) as client:
        result = await client.call_tool(name, arguments, meta=meta)
    assert error_of(result)["code"] == code


async def test_unknown_tool_comes_before_a_bad_request_id(url: str) -> None:
    meta: Any = {"carmy/request_id": "x" * 257}
    async with connect(url) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("no_such_tool", {}, meta=meta)
    assert refused.value.error.code == -32602


@pytest.mark.parametrize("version", ["2025-11-25", "2026-07-28"])
@pytest.mark.parametrize("arguments", [5, [], "text"])
async def test_arguments_that_are_not_an_object(url: str, version: str, arguments: Any) -> None:
    """MCP types ``arguments`` as an object: anything else is a malformed ``tools/call``, which
    the SDK refuses as invalid params before any check of ours (carmy/1 has no such layer)."""
    async with httpx.AsyncClient(timeout=10) as http:
        if version == "2025-11-25":
            headers = await handshake(http, url)
            params: dict[str, Any] = {"name": "echo", "arguments": arguments}
        else:
            headers = {**ACCEPT, "mcp-protocol-version": version, "mcp-method": "tools/call", "mcp-name": "echo"}
            params = {"name": "echo", "arguments": arguments, "_meta": {
                "io.modelcontextprotocol/protocolVersion": version, "io.modelcontextprotocol/clientCapabilities": {}}}
        r = await http.post(url, headers=headers, json=rpc("tools/call", params, id=1))
    data = [line[5:] for line in r.text.splitlines() if line.startswith("data:") and line[5:].strip()]
    message = json.loads(data[-1]) if data else r.json()
    assert message["error"]["code"] == -32602


@pytest.mark.parametrize(("name", "arguments", "request_id", "code"), [
    ("echo", {"text": 5}, None, "INVALID_ARGUMENTS"),
    ("echo", {"text": "a"}, "", "INVALID_ID"),
    ("wipe", {}, None, "CONFIRMATION_REQUIRED"),
    pytest.param("sleepy", {"seconds": 5, "tag": "mcp-recoverable"}, None, "TIMEOUT", marks=pytest.mark.slow),
])
async def test_recoverable_codes(url: str, name: str, arguments: dict[str, Any], request_id: str | None,
                                 code: str) -> None:
    meta: Any = None if request_id is None else {"carmy/request_id": request_id}
    async with connect(url) as client:
        err = error_of(await client.call_tool(name, arguments, meta=meta))
    assert (err["code"], err["recoverable"], err["retryable"]) == (code, True, False)


async def test_rate_limited_is_an_error_result(stack: Stack, url: str) -> None:
    """A quota's refusal over MCP: an error result saying when to send the very same call again;
    a retry of the call it accepted still replays, uncharged."""
    token = "quota-token-0123456789"
    settings = app_settings(stack.redis_url, api_keys={token: ApiKey(principal="mcp-quota")},
                            quotas=Quotas(default=Quota(rate=0.01, burst=1)))  # one call per 100 s
    first_meta: Any = {"carmy/request_id": "mcp-quota-1"}
    with serving_mcp(create_app(settings)) as quota_url:
        async with connect(quota_url, token=token) as client:
            first = await client.call_tool("echo", {"text": "a"}, meta=first_meta)
            refused = await client.call_tool("echo", {"text": "b"}, meta={"carmy/request_id": "mcp-quota-2"})
            again = await client.call_tool("echo", {"text": "a"}, meta=first_meta)
    assert not first.is_error and not again.is_error
    assert again.meta is not None and again.meta["carmy/replayed"] is True
    err = error_of(refused)
    assert err["code"] == "RATE_LIMITED" and err["retryable"] is True and err["details"] == {"limit": "rate"}
    assert 90 <= err["retry_after"] <= 100
    assert next_actions(refused) == [
        {"action": "retry", "tool": "echo", "same_request_id": True, "after_ms": err["retry_after"] * 1000}]
