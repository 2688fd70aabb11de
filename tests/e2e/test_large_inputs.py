"""One caller's large input costs that caller, not everyone: a big argument is checked in time
that grows with its size only, while other requests go on; and no answer or log line repeats
more than a few hundred characters of whatever a caller sent."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from bench.processes import status_kib
from tests.sse import parse
from tests.support import Proc, Stack, wait_until
from tests.trees import union_tree

KB = 1024
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def api(stack: Stack) -> tuple[Proc, str]:
    stack.worker()
    proc, base = stack.api()
    wait_until(lambda: "leaf_sum" in httpx.get(base + "/agent/tools").text)
    return proc, base


def rss_mb(pid: int) -> float:
    return status_kib(pid, "VmRSS") / 1024


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def binary_tree(size: int, leaf: Any) -> tuple[dict[str, Any], int]:
    """A balanced tree of ``tree_size``'s recursive input type, grown breadth first until its
    JSON is about ``size`` bytes, with ``leaf`` as the value of its leaves; and its node count."""
    root: dict[str, Any] = {"value": 1}
    frontier, nodes = [root], 1
    while nodes * 19 < size:
        node = frontier.pop(0)
        node["children"] = [{"value": leaf}, {"value": leaf}]
        frontier += node["children"]
        nodes += 2
    return root, nodes


def test_a_large_recursive_argument_does_not_hold_up_other_requests(api: tuple[Proc, str]) -> None:
    proc, base = api
    valid, nodes = binary_tree(480 * KB, 1)
    invalid, _ = binary_tree(480 * KB, "one")  # every leaf is wrong
    bodies = [compact({"tool": "tree_size", "arguments": args}) for args in (valid, invalid) * 2]
    assert all(len(body) > 400 * KB for body in bodies)
    before = rss_mb(proc.pid)
    health: list[float] = []
    with ThreadPoolExecutor(len(bodies)) as pool, httpx.Client(timeout=60) as client:
        start = time.monotonic()
        calls = [pool.submit(httpx.post, base + "/agent/execute", content=body, headers=JSON, timeout=60)
                 for body in bodies]
        while not all(call.done() for call in calls):
            asked = time.monotonic()
            assert client.get(base + "/health").status_code == 200
            health.append(time.monotonic() - asked)
        answered = time.monotonic() - start
        answers = [call.result() for call in calls]
    assert [a.status_code for a in answers] == [200, 400] * 2
    assert answers[0].json()["data"] == {"n": nodes}
    error = answers[1].json()["error"]
    assert error["code"] == "INVALID_ARGUMENTS"
    assert error["details"]["path"].startswith("$.children[")
    # Checked in milliseconds each (a pure-Python validator took seconds for each of these,
    # and /health waited behind them): generous bounds, for a busy machine.
    assert answered < 5.0
    assert max(health) < 3.0
    assert rss_mb(proc.pid) - before < 50


def test_invalid_recursive_unions_are_refused_in_bounded_time_and_memory(api: tuple[Proc, str]) -> None:
    # Asked for the first problem, jsonschema-rs answers a failed union with every alternative's
    # errors, nested unions included: for these four trees, /health waited 3 s and the API grew by
    # 640 MiB, which it kept, to answer "$.root: …(cut)". The check follows the tags to the first
    # wrong leaf in a millisecond (/health: 60 ms, +8 MiB).
    proc, base = api
    invalid, first_leaf = union_tree(512 * KB, "one")  # every leaf is wrong
    valid, _ = union_tree(512 * KB, 1)
    body = compact({"tool": "leaf_sum", "arguments": {"root": invalid}})
    assert len(body) > 400 * KB
    before = peak = rss_mb(proc.pid)
    health: list[float] = []
    with ThreadPoolExecutor(4) as pool, httpx.Client(timeout=60) as client:
        calls = [pool.submit(httpx.post, base + "/agent/execute", content=body, headers=JSON, timeout=60)
                 for _ in range(4)]
        while not all(call.done() for call in calls):
            asked = time.monotonic()
            assert client.get(base + "/health").status_code == 200
            health.append(time.monotonic() - asked)
            peak = max(peak, rss_mb(proc.pid))
        answers = [call.result() for call in calls]
        after = rss_mb(proc.pid)
        fine = compact({"tool": "leaf_sum", "arguments": {"root": valid}})
        done = client.post(base + "/agent/execute", content=fine, headers=JSON)
    assert [a.status_code for a in answers] == [400] * 4
    for answer in answers:
        assert answer.json()["error"]["code"] == "INVALID_ARGUMENTS"
        assert answer.json()["error"]["details"] == {"path": first_leaf, "reason": '"one" is not of type "integer"'}
    assert done.status_code == 200 and done.json()["data"]["n"] == fine.count(b'"leaf"')  # 1 per leaf
    # Generous bounds, for a busy machine: the check takes milliseconds and no memory to speak of.
    assert max(health, default=0.0) < 2.0
    assert peak - before < 100, (before, peak)
    assert after - before < 50, (before, after)


# Nothing a caller sent comes back, or goes to the log, longer than ECHO_LIMIT characters (and a
# mark saying it was cut). Offending values of 500 KB: the answers stay under a few KB.

BIG = "x" * 500_000
SMALL = 4 * KB  # an answer, whatever it refuses
SHORT_LINE = 2 * KB  # a log line
CUT = f"…(cut, {len(BIG)} characters)"


def logged(proc: Proc, since: int, event: str) -> list[str]:
    """The API's log lines after ``since`` characters, once the line of ``event`` is among them
    (it is written after the answer is sent)."""
    mark = f'"event": "{event}"'
    return str(wait_until(lambda: mark in proc.output()[since:] and proc.output()[since:])).splitlines()


@pytest.mark.parametrize(("body", "status", "code"), [
    ({"tool": "echo", "arguments": {"text": "a", "times": BIG}}, 400, "INVALID_ARGUMENTS"),
    ({"tool": "echo", "arguments": {"text": "a", BIG: 1}}, 400, "INVALID_ARGUMENTS"),
    ({"tool": BIG}, 404, "TOOL_NOT_FOUND"),
    ({"tool": "noop", "request_id": BIG}, 400, "INVALID_ID"),
    ({"tool": "noop", BIG: 1}, 400, "INVALID_REQUEST"),
], ids=["argument value", "argument name", "tool name", "request id", "envelope field"])
@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
def test_a_refusal_does_not_repeat_a_large_value(api: tuple[Proc, str], body: dict[str, Any], status: int,
                                                  code: str, sse: bool) -> None:
    proc, base = api
    since = len(proc.output())
    headers = {**JSON, "accept": "text/event-stream"} if sse else JSON
    r = httpx.post(base + "/agent/execute", content=compact(body), headers=headers, timeout=30)
    assert len(r.content) < SMALL
    if sse and code != "INVALID_REQUEST":  # envelope errors are JSON even when SSE was asked for
        assert r.status_code == 200
        name, result = parse(r.text)[-1]
        assert name == "execution.completed"
    else:
        assert r.status_code == status
        result = r.json()
    assert result["error"]["code"] == code
    assert all(len(line) < SHORT_LINE for line in logged(proc, since, "request"))


def test_an_invalid_argument_is_cut_and_still_says_what_is_wrong(api: tuple[Proc, str]) -> None:
    _, base = api
    r = httpx.post(base + "/agent/execute", content=compact({"tool": "echo", "arguments": {"text": BIG}}), headers=JSON)
    assert r.status_code == 200  # a long value is fine where it is allowed
    r = httpx.post(base + "/agent/execute", content=compact({"tool": "echo", "arguments": {"text": "a", "times": BIG}}),
                   headers=JSON)
    details = r.json()["error"]["details"]
    assert details["path"] == "$.times"
    assert details["reason"] == '"' + "x" * 256 + CUT + '" is not of type "integer"'
    r = httpx.post(base + "/agent/execute", content=compact({"tool": BIG}), headers=JSON)
    assert r.json()["error"]["message"] == f"No tool named '{'x' * 256}{CUT}'."


MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json",
               "mcp-protocol-version": "2025-11-25"}


def mcp_call(base: str, params: dict[str, Any]) -> tuple[httpx.Response, list[dict[str, Any]]]:
    """A raw ``tools/call`` (stateless: no session needed); the answer and its JSON-RPC messages."""
    r = httpx.post(base + "/mcp", content=compact({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                                   "params": params}), headers=MCP_HEADERS, timeout=30)
    assert r.status_code == 200
    if r.headers["content-type"].startswith("text/event-stream"):
        return r, [data for _, data in parse(r.text.replace("\r\n", "\n"))]
    return r, [r.json()]


@pytest.mark.parametrize(("params", "code"), [
    ({"name": BIG, "arguments": {}}, -32602),  # unknown tool: a protocol error in MCP
    ({"name": "echo", "arguments": {"text": "a", "times": BIG}}, "INVALID_ARGUMENTS"),
    ({"name": "echo", "arguments": {"text": "a", BIG: 1}}, "INVALID_ARGUMENTS"),
    ({"name": "noop", "arguments": {}, "_meta": {"carmy/request_id": BIG}}, "INVALID_ID"),
    ({"name": "noop", "arguments": {}, "_meta": {"carmy/request_id": {"id": BIG}}}, "INVALID_ID"),
], ids=["tool name", "argument value", "argument name", "request id", "request id not a string"])
def test_an_mcp_refusal_does_not_repeat_a_large_value(api: tuple[Proc, str], params: dict[str, Any],
                                                      code: str | int) -> None:
    proc, base = api
    since = len(proc.output())
    r, messages = mcp_call(base, params)
    assert len(r.content) < SMALL
    if isinstance(code, int):
        assert messages[-1]["error"]["code"] == code
    else:
        result = messages[-1]["result"]
        assert result["isError"] is True
        assert result["_meta"]["carmy/error"]["code"] == code
    assert all(len(line) < SHORT_LINE for line in logged(proc, since, "mcp.call"))


def test_an_over_long_progress_token_gets_no_progress(api: tuple[Proc, str]) -> None:
    # Each notification would repeat the token: MCP lets a server send none.
    _, base = api
    arguments = {"n": 3}
    _, messages = mcp_call(base, {"name": "progress", "arguments": arguments, "_meta": {"progressToken": "p1"}})
    assert [m["params"]["progress"] for m in messages[:-1]] == [1, 2, 3]
    r, messages = mcp_call(base, {"name": "progress", "arguments": arguments, "_meta": {"progressToken": BIG}})
    assert len(r.content) < SMALL
    assert len(messages) == 1
    assert messages[0]["result"]["structuredContent"] == {"n": 3}
