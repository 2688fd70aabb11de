"""Redis at its ``maxmemory`` (``noeviction``, as compose and bin/run run it), with the real API
and worker processes: new calls are refused at once with a retryable 503 ``STORE_FULL``, over
HTTP and MCP alike, the calls already accepted still get their results, ``/ready`` and
``/metrics`` say so, and calls are admitted again, no process restarted, once memory frees."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.conftest import private_stack
from tests.support import Call, RedisServer, Stack, marked, mcp_message, wait_until

MIB = 1_048_576
# However busy the machine, an answer takes seconds; a call that hangs takes for ever.
ANSWER_S = 15.0
BIG_RESULT = {"tool": "echo", "arguments": {"text": "x" * 1024, "times": 64}}  # 64 KiB of result


@pytest.fixture
def full_stack() -> Iterator[tuple[RedisServer, Stack, str]]:
    with private_stack() as (server, stack):
        stack.worker(env={"CARMY_CONCURRENCY": "4"})
        _, base = stack.api()
        wait_until(lambda: "gate" in httpx.get(base + "/agent/tools").text)
        yield server, stack, base


def post(http: httpx.Client, base: str, body: dict[str, Any]) -> httpx.Response:
    try:
        return http.post(base + "/agent/execute", json=body, timeout=ANSWER_S)
    except httpx.TimeoutException:
        pytest.fail(f"a call of {body['tool']} got no answer within {ANSWER_S:g} s")


def used(client: redis.Redis) -> int:
    """What Redis holds against its maxmemory."""
    info: dict[str, Any] = client.info("memory")  # type: ignore[assignment]  # sync client
    return int(info["used_memory"]) - int(info.get("mem_not_counted_for_evict", 0))


def assert_store_full(r: httpx.Response, tool: str) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "5"
    body = r.json()
    error = body["error"]
    assert error["code"] == "STORE_FULL"
    assert "out of memory" in error["message"]
    assert (error["category"], error["retryable"], error["retry_after"]) == ("capacity", True, 5)
    # Nothing was recorded: the very same call, request_id included, once memory frees.
    assert body["_agent"]["next_actions"] == [
        {"action": "retry", "tool": tool, "same_request_id": True, "after_ms": 5000}]


def ready(base: str) -> dict[str, Any]:
    return httpx.get(base + "/ready").json()  # type: ignore[no-any-return]


def metric(base: str, name: str) -> float:
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")


def mcp_call(base: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A raw, stateless ``tools/call``: its JSON-RPC result."""
    r = httpx.post(base + "/mcp", timeout=ANSWER_S, json={
        "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name, "arguments": arguments}},
        headers={"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"})
    assert r.status_code == 200, r.text
    result: dict[str, Any] = mcp_message(r)["result"]
    return result


def all_settled(client: redis.Redis) -> bool:
    states = [client.hget(k, "state") for k in client.scan_iter("carmy:*:exe:*")]
    return bool(states) and all(s == b"done" for s in states)


def test_results_filling_redis_get_store_full_and_calls_come_back_when_memory_frees(
        full_stack: tuple[RedisServer, Stack, str]) -> None:
    server, stack, base = full_stack
    client = server.client()
    # Room for a few dozen 64 KiB results beyond what Redis holds now.
    client.config_set("maxmemory", used(client) + 4 * MIB)
    answers: list[httpx.Response] = []
    with httpx.Client() as http:
        while len(answers) < 400 and [r.status_code for r in answers[-3:]] != [503] * 3:
            answers.append(post(http, base, {**BIG_RESULT, "request_id": f"fill-{len(answers)}"}))
    statuses = [r.status_code for r in answers]
    assert statuses[-3:] == [503] * 3, "Redis never filled up"
    first_refused = statuses.index(503)
    assert first_refused >= 10  # results were stored until the memory ran out
    for r in answers[:first_refused]:
        assert r.json()["data"] == {"text": "x" * 65536}
    # Refused from then on, at once: never a 500, never a call left without an answer.
    assert set(statuses[first_refused:]) <= {200, 503}
    for r in answers[first_refused:]:
        if r.status_code == 503:
            assert_store_full(r, "echo")
    check = ready(base)["checks"]["memory"]
    assert check["ok"] is False and check["error"]["code"] == "STORE_FULL"
    assert check["used_bytes"] >= check["admit_below_bytes"]
    assert metric(base, "carmy_redis_memory_full") == 1
    assert metric(base, "carmy_api_store_full_refusals_total") >= 3
    assert httpx.get(base + "/ready").status_code == 503

    # The records expire (CARMY_RETENTION), and memory with them: admitted again, no restart.
    client.delete(*client.keys("carmy:*:rec:*"))
    wait_until(lambda: ready(base)["checks"]["memory"]["ok"], what="/ready says memory is there again")
    assert ready(base)["ready"] is True
    assert metric(base, "carmy_redis_memory_full") == 0
    with httpx.Client() as http:
        again = post(http, base, {**BIG_RESULT, "request_id": f"fill-{len(answers) - 1}"})
    assert again.status_code == 200  # the refused request_id was not spent: it runs now
    assert again.json()["data"] == {"text": "x" * 65536}
    wait_until(lambda: all_settled(client))
    assert all(p.alive() for p in stack.procs)
    client.close()


def test_calls_accepted_before_redis_filled_up_still_get_their_results(
        full_stack: tuple[RedisServer, Stack, str]) -> None:
    server, stack, base = full_stack
    client = server.client()
    tags = ["a", "b", "c"]
    calls = [Call(base, {"tool": "gate", "arguments": {"tag": tag}}) for tag in tags]
    for tag in tags:
        marked(stack.tmp / f"gate-start-{tag}")
    # Redis over its limit: every write that may grow its memory is refused from now on.
    client.config_set("maxmemory", used(client) // 2)

    with httpx.Client() as http:
        assert_store_full(post(http, base, {"tool": "noop"}), "noop")
    result = mcp_call(base, "noop", {})
    assert result["isError"] is True
    assert result["_meta"]["carmy/error"]["code"] == "STORE_FULL"
    assert ready(base)["checks"]["memory"]["ok"] is False
    # A worker that starts now comes up (it used to exit, its info refused), to serve what is queued.
    stack.worker()

    # The accepted calls end while Redis is full: their records are written all the same.
    for tag in tags:
        (stack.tmp / f"gate-open-{tag}").touch()
    for call in calls:
        r = call.result(ANSWER_S)
        assert r.status_code == 200, r.text
        assert r.json()["data"] == {"n": 1}

    # More memory (CONFIG SET, as an operator would): admitted again at once, nothing restarted.
    client.config_set("maxmemory", 0)
    wait_until(lambda: ready(base)["ready"], what="/ready says ready again")
    with httpx.Client() as http:
        assert post(http, base, {"tool": "noop"}).status_code == 200
    wait_until(lambda: all_settled(client))
    assert all(p.alive() for p in stack.procs)
    client.close()
