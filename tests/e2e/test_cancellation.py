"""A caller that goes away cancels its execution: the running tool gets CancelledError within a
second, a queued one never starts, and the record says cancelled."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from carmy_worker.store import jobs, keys
from tests.support import Stack, marked, wait_until


@pytest.fixture(scope="module")
def base(stack: Stack) -> Iterator[str]:
    stack.worker(env={"CARMY_CONCURRENCY": "1"})
    _, url = stack.api()
    wait_until(lambda: "linger" in httpx.get(url + "/agent/tools").text)
    yield url


@contextlib.contextmanager
def calling(base: str, body: dict[str, object]) -> Iterator[None]:
    """A POST /agent/execute whose caller goes away (closes its connection) when the block ends:
    when the test has seen what it waits for, not after a guessed delay."""
    host, port = base.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /agent/execute HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
        yield


@contextlib.contextmanager
def streaming(base: str, body: dict[str, object]) -> Iterator[None]:
    """The same call over SSE, its block entered once the stream has said ``tool.started``."""
    with httpx.Client(timeout=30) as client, client.stream(
        "POST", base + "/agent/execute", json=body, headers={"accept": "text/event-stream"}
    ) as r:
        seen = ""
        for chunk in r.iter_text():
            seen += chunk
            if "tool.started" in seen:
                break
        assert "tool.started" in seen
        yield


def stamp(path: Path) -> float:
    return float(marked(path).split()[0])


def assert_cancelled_record(base: str, body: dict[str, object], started: bool) -> None:
    replay = httpx.post(base + "/agent/execute", json=body)
    assert replay.status_code == 408
    result = replay.json()
    assert result["status"] == "cancelled"
    assert result["error"]["code"] == "CANCELLED"
    assert result["error"]["category"] == "cancelled"
    assert ("may have committed" in result["error"]["message"]) is started


def test_json_disconnect_cancels_the_running_tool(base: str, stack: Stack) -> None:
    body = {"tool": "linger", "arguments": {"seconds": 20, "tag": "json"}, "request_id": "cancel-json"}
    with calling(base, body):
        marked(stack.tmp / "linger-start-json")
    gone_at = time.time()  # the connection is closed
    cancelled = stack.tmp / "linger-cancelled-json"
    assert stamp(cancelled) - gone_at < 1.0
    assert_cancelled_record(base, body, started=True)


def test_sse_disconnect_cancels_the_running_tool(base: str, stack: Stack) -> None:
    body = {"tool": "linger", "arguments": {"seconds": 20, "tag": "sse"}, "request_id": "cancel-sse"}
    with streaming(base, body):
        # tool.started says a worker claimed the execution: its tool may not have taken its first
        # step yet, and a caller gone before that step cancels a tool that never ran. The test is
        # of a running tool, as the JSON one above: the caller goes once the tool has begun.
        marked(stack.tmp / "linger-start-sse")
    gone_at = time.time()
    cancelled = stack.tmp / "linger-cancelled-sse"
    assert stamp(cancelled) - gone_at < 1.0
    assert_cancelled_record(base, body, started=True)


def test_a_caller_gone_as_soon_as_it_hears_tool_started_cancels_whether_or_not_the_tool_began(
        base: str, stack: Stack) -> None:
    # A race on purpose: the cancel may reach the worker before its tool's first step or after.
    body = {"tool": "linger", "arguments": {"seconds": 20, "tag": "early"}, "request_id": "cancel-early"}
    with streaming(base, body):
        pass
    assert_cancelled_record(base, body, started=True)  # settled once the tool has stopped
    if (stack.tmp / "linger-start-early").exists():  # it began: it was cancelled, not left to run
        marked(stack.tmp / "linger-cancelled-early", timeout=5)


def test_abandoned_queued_execution_never_starts(base: str, stack: Stack, sync_redis: redis.Redis) -> None:
    # The worker runs one execution at a time: the second one waits in the queue.
    busy = {"tool": "linger", "arguments": {"seconds": 20, "tag": "busy"}}
    queued = {"tool": "linger", "arguments": {"seconds": 1, "tag": "queued"}, "request_id": "cancel-queued"}
    with calling(base, busy):
        marked(stack.tmp / "linger-start-busy")
        with calling(base, queued):
            # Accepted: it waits in the queue of executions not yet started.
            [exec_id] = wait_until(
                lambda: [e for p in keys.partitions() for e in sync_redis.zrange(keys.queued(p), 0, -1)])
        wait_until(lambda: sync_redis.exists(keys.record(exec_id.decode())))  # settled, since its caller left
        assert_cancelled_record(base, queued, started=False)
    # Its caller gone too, the busy execution is cancelled: the worker is free again. It takes
    # the queued job (arq's job key goes when it is done with it) and drops it without running it.
    wait_until(lambda: not sync_redis.exists(jobs.job_key(exec_id.decode())))
    assert not (stack.tmp / "linger-start-queued").exists()
    # The worker found the settled job and dropped it quietly.
    assert "Traceback" not in stack.procs[0].output()
