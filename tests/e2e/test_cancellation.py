"""A caller that goes away cancels its execution: the running tool gets CancelledError within a
second, a queued one never starts, and the record says cancelled."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import Stack, wait_until


@pytest.fixture(scope="module")
def base(stack: Stack) -> Iterator[str]:
    stack.worker(env={"CARMY_CONCURRENCY": "1"})
    _, url = stack.api()
    wait_until(lambda: "linger" in httpx.get(url + "/agent/tools").text)
    yield url


def stamp(path: Path) -> float:
    return float(path.read_text().split()[0])


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
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(base + "/agent/execute", json=body, timeout=httpx.Timeout(5, read=0.5))
    gone_at = time.time()  # httpx has closed the connection
    cancelled = stack.tmp / "linger-cancelled-json"
    wait_until(cancelled.exists, 5)
    assert stamp(cancelled) - gone_at < 1.0
    assert_cancelled_record(base, body, started=True)


def test_sse_disconnect_cancels_the_running_tool(base: str, stack: Stack) -> None:
    body = {"tool": "linger", "arguments": {"seconds": 20, "tag": "sse"}, "request_id": "cancel-sse"}
    with httpx.Client() as client, client.stream(
        "POST", base + "/agent/execute", json=body, headers={"accept": "text/event-stream"}
    ) as r:
        seen = ""
        for chunk in r.iter_text():
            seen += chunk
            if "tool.started" in seen:
                break
    gone_at = time.time()
    cancelled = stack.tmp / "linger-cancelled-sse"
    wait_until(cancelled.exists, 5)
    assert stamp(cancelled) - gone_at < 1.0
    assert_cancelled_record(base, body, started=True)


def test_abandoned_queued_execution_never_starts(base: str, stack: Stack) -> None:
    # The worker runs one execution at a time: the second one waits in the queue.
    busy = {"tool": "linger", "arguments": {"seconds": 1.5, "tag": "busy"}}
    queued = {"tool": "linger", "arguments": {"seconds": 1, "tag": "queued"}, "request_id": "cancel-queued"}
    with httpx.Client(timeout=10) as first:
        holder = threading.Thread(target=lambda: first.post(base + "/agent/execute", json=busy))
        holder.start()
        wait_until((stack.tmp / "linger-start-busy").exists, 5)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(base + "/agent/execute", json=queued, timeout=httpx.Timeout(5, read=0.3))
        holder.join(10)
    time.sleep(0.5)  # the worker is free again and has looked at its queue
    assert not (stack.tmp / "linger-start-queued").exists()
    assert_cancelled_record(base, queued, started=False)
    # The worker found the settled job and dropped it quietly.
    assert "Traceback" not in stack.procs[0].output()
