"""POST /agent/execute through the in-process app, against real Redis and a real worker."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from api.app import create_app
from tests.api.test_mcp import call_error
from tests.conftest import asgi_client
from tests.sse import parse as parse_sse
from tests.support import Stack, app_settings

MIB = 1_048_576


async def execute(client: httpx.AsyncClient, body: Any, **kw: Any) -> httpx.Response:
    return await client.post("/agent/execute", json=body, **kw)


def assert_result_shape(body: dict[str, Any], status: str, next_actions: list[Any] | None = None) -> None:
    assert body["execution_id"].startswith("exec_")
    assert body["status"] == status
    assert body["_agent"]["next_actions"] == (next_actions or [])
    if status == "completed":
        assert "error" not in body
    else:
        assert "data" not in body
        assert set(body["error"]) >= {"code", "message", "category", "recoverable", "retryable"}


async def test_success_json(client: httpx.AsyncClient) -> None:
    r = await execute(client, {"tool": "echo", "arguments": {"text": "ab", "times": 2}})
    assert r.status_code == 200
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert_result_shape(body, "completed")
    assert body["data"] == {"text": "abab"}
    assert body["_agent"]["cacheable"] is True
    assert list(body) == ["execution_id", "status", "data", "_agent"]


async def test_arguments_default_to_empty_object(client: httpx.AsyncClient) -> None:
    r = await execute(client, {"tool": "noop"})
    assert r.status_code == 200
    assert r.json()["data"] == {}


async def test_sync_tool(client: httpx.AsyncClient) -> None:
    r = await execute(client, {"tool": "echo_sync", "arguments": {"text": "x", "times": 3}})
    assert r.status_code == 200
    assert r.json()["data"] == {"text": "xxx"}


async def test_cacheable_only_for_idempotent_reads(client: httpx.AsyncClient) -> None:
    write = await execute(client, {"tool": "tally", "arguments": {"name": "cacheable"}})
    assert write.status_code == 200
    assert write.json()["_agent"]["cacheable"] is False
    failure = await execute(client, {"tool": "refuse"})
    assert failure.json()["_agent"]["cacheable"] is False
    read = await execute(client, {"tool": "whoami"})
    assert read.json()["_agent"]["cacheable"] is True


@pytest.mark.parametrize(("raw", "reason_part"), [
    (b"{not json", "malformed"),
    (b"[]", "Expected `object`"),
    (b'{"tool": 5}', "Expected `str`"),
    (b'{"arguments": {}}', "missing required field `tool`"),
    (b'{"tool": "echo", "context": {"principal": "root"}}', "unknown field `context`"),
    (b'{"tool": "echo", "permissions": ["confirm:wipe"]}', "unknown field `permissions`"),
    (b'{"tool": "echo", "arguments": {"text": NaN}}', "malformed"),
    (b'{"tool": "echo", "request_id": 7}', "Expected `str | null`"),
    (b"", "truncated"),
    (b'{"tool": "anything", "arguments": {"value": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}", "deep"),
])
async def test_invalid_request(client: httpx.AsyncClient, raw: bytes, reason_part: str) -> None:
    r = await client.post("/agent/execute", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    body = r.json()
    assert list(body) == ["error"]
    assert body["error"]["code"] == "INVALID_REQUEST"
    assert body["error"]["category"] == "validation"
    assert reason_part.lower() in body["error"]["details"]["reason"].lower()


@pytest.mark.parametrize(("path", "extra", "where"), [
    ("/agent/execute", {}, ""),
    ("/agent/jobs", {}, ""),
    ("/agent/jobs", {"notify": {"url": "https://hooks.example/"}}, " - at `$.notify`"),
], ids=["execute", "job", "job's notify"])
async def test_a_long_unknown_field_is_cut_to_its_own_length(client: httpx.AsyncClient, path: str,
                                                             extra: dict[str, Any], where: str) -> None:
    # protocol.md, "What an error repeats of the request": 256 characters of the name, then its
    # own length, and the message still ends as msgspec ends it.
    name = "y" * 400
    body: dict[str, Any] = {"tool": "noop", **extra}
    (body["notify"] if extra else body)[name] = 1
    r = await client.post(path, json=body)
    assert r.status_code == 400
    assert r.json()["error"]["details"]["reason"] == \
        f"Object contains unknown field `{'y' * 256}…(cut, 400 characters)`{where}"


JSON = {"content-type": "application/json"}


def padded(size: int) -> bytes:
    """A valid execute body of exactly ``size`` bytes (JSON allows trailing white space)."""
    body = b'{"tool": "noop"}'
    return body + b" " * (size - len(body))


async def test_body_of_exactly_one_mib_is_accepted(client: httpx.AsyncClient) -> None:
    r = await client.post("/agent/execute", content=padded(MIB), headers=JSON)
    assert r.status_code == 200, r.text


async def test_one_byte_more_is_refused(client: httpx.AsyncClient) -> None:
    r = await client.post("/agent/execute", content=padded(MIB + 1), headers=JSON)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert r.json()["error"]["category"] == "capacity"


async def test_limit_holds_without_content_length(client: httpx.AsyncClient) -> None:
    def chunks(size: int) -> Any:
        data = padded(size)
        async def gen() -> AsyncIterator[bytes]:
            for i in range(0, len(data), 65536):
                yield data[i:i + 65536]
        return gen()

    ok = await client.post("/agent/execute", content=chunks(MIB), headers=JSON)
    assert ok.status_code == 200
    too_big = await client.post("/agent/execute", content=chunks(MIB + 1), headers=JSON)
    assert "content-length" not in too_big.request.headers
    assert too_big.status_code == 413


@pytest.mark.parametrize(("request_id", "status"), [
    ("", 400), ("r" * 256, 200), ("r" * 257, 400), ("é" * 128, 200), ("é" * 129, 400),
])
async def test_request_id_length(client: httpx.AsyncClient, request_id: str, status: int) -> None:
    r = await execute(client, {"tool": "noop", "request_id": request_id})
    assert r.status_code == status
    if status == 400:
        body = r.json()
        assert_result_shape(body, "failed")
        assert body["error"]["code"] == "INVALID_ID"


async def test_tool_not_found(client: httpx.AsyncClient) -> None:
    r = await execute(client, {"tool": "no_such_tool"})
    assert r.status_code == 404
    body = r.json()
    assert_result_shape(body, "failed")
    assert body["error"]["code"] == "TOOL_NOT_FOUND"
    assert body["error"]["category"] == "not_found"


@pytest.mark.parametrize(("arguments", "path"), [
    ({}, "$"),
    ({"text": 5}, "$.text"),
    ({"text": "a", "times": "2"}, "$.times"),
    ({"text": "a", "hallucinated": True}, "$"),
])
async def test_invalid_arguments(client: httpx.AsyncClient, arguments: dict[str, Any], path: str) -> None:
    r = await execute(client, {"tool": "echo", "arguments": arguments})
    assert r.status_code == 400
    body = r.json()
    assert_result_shape(body, "failed")
    assert body["error"]["code"] == "INVALID_ARGUMENTS"
    assert body["error"]["details"]["path"] == path
    if "hallucinated" in arguments:
        assert "hallucinated" in body["error"]["details"]["reason"]


async def test_no_input_tool_refuses_arguments(client: httpx.AsyncClient) -> None:
    r = await execute(client, {"tool": "noop", "arguments": {"x": 1}})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "INVALID_ARGUMENTS"


async def test_invalid_output(client: httpx.AsyncClient) -> None:
    r = await execute(client, {"tool": "bad_output"})
    assert r.status_code == 500
    body = r.json()
    assert_result_shape(body, "failed")
    assert body["error"]["code"] == "INVALID_OUTPUT"
    assert body["error"]["category"] == "internal"


@pytest.mark.parametrize("tool", ["wipe", "publish"])
async def test_confirmation_required(client: httpx.AsyncClient, tool: str) -> None:
    r = await execute(client, {"tool": tool})
    assert r.status_code == 403
    body = r.json()
    # The same call, request_id included, once a person has granted confirm:<tool>.
    assert_result_shape(body, "failed", [
        {"action": "retry", "tool": tool, "same_request_id": True, "requires": f"confirm:{tool}"}])
    assert body["error"]["code"] == "CONFIRMATION_REQUIRED"
    assert f"confirm:{tool}" in body["error"]["message"]


@pytest.mark.slow
async def test_timeout_async(client: httpx.AsyncClient, stack: Stack) -> None:
    start = time.monotonic()
    r = await execute(client, {"tool": "sleepy", "arguments": {"seconds": 5, "tag": "t1"}})
    elapsed = time.monotonic() - start
    assert r.status_code == 504
    body = r.json()
    # sleepy is idempotent: calling it again is safe, with a new request_id (the old one replays this).
    assert_result_shape(body, "timed_out", [{"action": "retry", "tool": "sleepy", "same_request_id": False}])
    assert body["error"]["code"] == "TIMEOUT"
    assert body["error"]["category"] == "timeout"
    assert "may have committed" in body["error"]["message"]
    assert elapsed < 3
    assert (stack.tmp / "sleepy-cancelled-t1").exists()  # the tool itself was stopped


async def test_timeout_sync_answers_on_time(client: httpx.AsyncClient) -> None:
    start = time.monotonic()
    r = await execute(client, {"tool": "sleepy_sync", "arguments": {"seconds": 3}})
    elapsed = time.monotonic() - start
    assert r.status_code == 504
    assert r.json()["status"] == "timed_out"
    assert elapsed < 2  # the timeout is 0.5 s; the thread itself sleeps 3 s


async def test_tool_panic_hides_exception_text(client: httpx.AsyncClient, stack: Stack) -> None:
    r = await execute(client, {"tool": "explode"})
    assert r.status_code == 500
    body = r.json()
    assert_result_shape(body, "failed")
    assert body["error"]["code"] == "TOOL_PANIC"
    assert "hunter2" not in r.text
    assert "may have committed" in body["error"]["message"]
    # The operator sees it, with the execution id.
    logs = "".join(p.output() for p in stack.procs)
    assert "hunter2" in logs
    assert body["execution_id"] in logs


async def test_tool_error_is_passed_through(client: httpx.AsyncClient) -> None:
    r = await execute(client, {"tool": "refuse"})
    assert r.status_code == 409
    assert r.headers["retry-after"] == "7"
    body = r.json()
    # Retryable, but recorded: again after retry_after, with a new request_id.
    assert_result_shape(body, "failed", [
        {"action": "retry", "tool": "refuse", "same_request_id": False, "after_ms": 7000}])
    assert body["error"] == {
        "code": "OUT_OF_STOCK", "message": "Nothing left.", "category": "conflict", "recoverable": True,
        "retryable": True, "retry_after": 7, "suggested_action": "wait", "details": {"sku": "KB-01"},
    }


async def test_trusted_context_cannot_come_from_the_body(client: httpx.AsyncClient) -> None:
    r = await execute(client, {"tool": "whoami"})
    assert r.json()["data"] == {"principal": None, "session": None, "permissions": [], "request_id": None}
    r = await execute(client, {"tool": "whoami", "request_id": "abc"})
    assert r.json()["data"]["request_id"] == "abc"


async def test_unknown_route_and_method(client: httpx.AsyncClient) -> None:
    assert (await client.get("/agent/execute")).status_code == 405
    assert (await client.get("/nope")).status_code == 404


# --- arguments that are not an object: an argument error like any other ----------------------


@pytest.mark.parametrize("arguments", [[], 5, "text", None, True, [{"text": "a"}]])
async def test_arguments_that_are_not_an_object(client: httpx.AsyncClient, arguments: Any) -> None:
    r = await execute(client, {"tool": "echo", "arguments": arguments})
    assert r.status_code == 400
    body = r.json()
    assert list(body) == ["execution_id", "status", "error", "_agent"]
    assert_result_shape(body, "failed")
    assert body["error"]["code"] == "INVALID_ARGUMENTS"
    assert body["error"]["recoverable"] is True
    assert body["error"]["details"]["path"] == "$"
    assert "object" in body["error"]["details"]["reason"]


async def test_arguments_that_are_not_an_object_over_sse(client: httpx.AsyncClient) -> None:
    r = await execute(client, {"tool": "echo", "arguments": 5}, headers={"accept": "text/event-stream"})
    assert r.status_code == 200
    events = parse_sse(r.text)
    assert [name for name, _ in events] == ["execution.started", "execution.completed"]
    assert events[1][1]["error"]["code"] == "INVALID_ARGUMENTS"


async def test_a_long_non_object_is_quoted_cut(client: httpx.AsyncClient) -> None:
    r = await execute(client, {"tool": "echo", "arguments": "x" * 100_000})
    assert r.json()["error"]["code"] == "INVALID_ARGUMENTS"
    assert len(r.content) < 2_000


# --- the order of the checks: tool, policy, request_id, arguments ----------------------------

LONG_ID = "r" * 257


@pytest.mark.parametrize(("body", "status", "code"), [
    ({"tool": "no_such_tool", "request_id": LONG_ID}, 404, "TOOL_NOT_FOUND"),
    ({"tool": "no_such_tool", "request_id": LONG_ID, "arguments": 5}, 404, "TOOL_NOT_FOUND"),
    ({"tool": "wipe", "request_id": LONG_ID}, 403, "CONFIRMATION_REQUIRED"),
    ({"tool": "publish", "request_id": "", "arguments": {"no": "such"}}, 403, "CONFIRMATION_REQUIRED"),
    ({"tool": "echo", "request_id": LONG_ID, "arguments": {"text": 5}}, 400, "INVALID_ID"),
    ({"tool": "echo", "request_id": "", "arguments": []}, 400, "INVALID_ID"),
])
async def test_order_of_checks(client: httpx.AsyncClient, body: dict[str, Any], status: int, code: str) -> None:
    r = await execute(client, body)
    assert r.status_code == status
    assert r.json()["error"]["code"] == code


# --- next_actions of refusals (nothing recorded: the same call, request_id included) ---------


async def test_conflict_suggests_a_new_request_id(client: httpx.AsyncClient) -> None:
    first = await execute(client, {"tool": "echo", "arguments": {"text": "a"}, "request_id": "next-conflict"})
    assert first.status_code == 200
    r = await execute(client, {"tool": "echo", "arguments": {"text": "b"}, "request_id": "next-conflict"})
    assert r.status_code == 409
    body = r.json()
    assert_result_shape(body, "failed", [{"action": "retry", "tool": "echo", "same_request_id": False}])
    assert body["error"]["recoverable"] is True


@pytest.mark.parametrize("body", [
    {"tool": "no_such_tool"},
    {"tool": "echo", "request_id": LONG_ID},
    {"tool": "echo", "arguments": {"text": 5}},
    {"tool": "bad_output"},
    {"tool": "explode"},
])
async def test_nothing_to_suggest(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    r = await execute(client, body)
    assert r.status_code >= 400
    assert r.json()["_agent"]["next_actions"] == []


async def test_next_actions_are_the_same_in_sse_and_replays(client: httpx.AsyncClient) -> None:
    call = {"tool": "refuse", "request_id": "next-replay"}
    first = await execute(client, call)
    expected = [{"action": "retry", "tool": "refuse", "same_request_id": False, "after_ms": 7000}]
    assert first.json()["_agent"]["next_actions"] == expected
    again = await execute(client, call)
    assert again.content == first.content
    streamed = await execute(client, call, headers={"accept": "text/event-stream"})
    final = parse_sse(streamed.text)[-1][1]
    assert final["_agent"]["next_actions"] == expected and final["replayed"] is True


# --- recoverable: what it means here (docs/protocol.md, section 10) --------------------------


@pytest.mark.parametrize(("body", "code"), [
    ({"tool": "echo", "arguments": {"text": 5}}, "INVALID_ARGUMENTS"),
    ({"tool": "echo", "arguments": {"text": "a"}, "request_id": LONG_ID}, "INVALID_ID"),
    ({"tool": "wipe"}, "CONFIRMATION_REQUIRED"),
    pytest.param({"tool": "sleepy", "arguments": {"seconds": 5, "tag": "recoverable"}}, "TIMEOUT",
                 marks=pytest.mark.slow),
])
async def test_recoverable_codes(client: httpx.AsyncClient, body: dict[str, Any], code: str) -> None:
    err = (await execute(client, body)).json()["error"]
    assert (err["code"], err["recoverable"], err["retryable"]) == (code, True, False)


@pytest.mark.parametrize(("body", "code"), [
    ({"tool": "no_such_tool"}, "TOOL_NOT_FOUND"),
    ({"tool": "explode"}, "TOOL_PANIC"),
    ({"tool": "bad_output"}, "INVALID_OUTPUT"),
])
async def test_unrecoverable_codes(client: httpx.AsyncClient, body: dict[str, Any], code: str) -> None:
    err = (await execute(client, body)).json()["error"]
    assert (err["code"], err["recoverable"], err["retryable"]) == (code, False, False)


@pytest.mark.slow
async def test_before_redis_is_first_read_a_call_is_store_unavailable_not_tool_not_found() -> None:
    # An API that starts while Redis is out of reach has an empty catalog because it has not read
    # one: its calls are the retryable STORE_UNAVAILABLE (protocol.md, section 4), never the
    # unrecoverable TOOL_NOT_FOUND, whichever door they come in by.
    async with asgi_client(create_app(app_settings())) as client:  # nothing listens at its Redis
        for path in ("/agent/execute", "/agent/jobs"):
            r = await client.post(path, json={"tool": "noop"})
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "STORE_UNAVAILABLE"
        mcp = await client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                              "params": {"name": "noop", "arguments": {}}},
                                headers={"accept": "application/json, text/event-stream",
                                         "mcp-protocol-version": "2025-11-25"})
        assert call_error(mcp)["code"] == "STORE_UNAVAILABLE"
