"""A worker stops on SIGTERM even when a tool left a thread running for ever: a sync tool that
never returned (its caller answered ``TIMEOUT`` long before), or a thread a tool started. Python's
exit joins such threads, and held the drained worker there, deregistered and serving nothing,
until someone killed it."""

from __future__ import annotations

import signal
import time
import uuid

import httpx

from tests.support import Call, Stack, wait_until
from tests.toolsets.misbehaving import TIMEOUT

MODULE = "tests.toolsets.misbehaving"


def call(base: str, tool: str) -> httpx.Response:
    return httpx.post(base + "/agent/execute", json={"tool": tool, "request_id": str(uuid.uuid4())},
                      timeout=TIMEOUT + 10)


def test_a_worker_stops_whatever_threads_its_tools_left_running(stack: Stack) -> None:
    worker = stack.worker(MODULE)
    _, base = stack.api()
    wait_until(lambda: "never_returns_sync" in httpx.get(base + "/agent/tools").text)
    assert call(base, "never_returns_sync").json()["error"]["code"] == "TIMEOUT"
    assert call(base, "leaves_a_thread").status_code == 200
    assert call(base, "ok").json()["data"] == {"n": 1}  # it serves on meanwhile

    start = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.popen.wait(15) == 0, worker.output()[-2000:]
    assert time.monotonic() - start < 5  # nothing ran: the drain has nothing to wait for
    assert "exiting without waiting for 2 threads still running" in worker.output()


def test_a_task_a_tool_left_behind_cannot_end_the_worker(stack: Stack) -> None:
    """asyncio re-raises a task's SystemExit out of the event loop: a tool's stray task that
    called sys.exit ended its worker, and every execution running there ended uncertain."""
    worker = stack.worker(MODULE)
    _, base = stack.api()
    wait_until(lambda: "leaves_a_task_that_exits" in httpx.get(base + "/agent/tools").text)
    running = Call(base, {"tool": "ticks", "arguments": {"n": 10, "every": 0.1}})  # another caller's, 1 s long
    assert call(base, "leaves_a_task_that_exits").status_code == 200
    wait_until(lambda: "Task exception was never retrieved" in worker.output(), what="the stray's exit logged")
    assert running.result().json()["data"] == {"n": 10}
    assert call(base, "ok").json()["data"] == {"n": 1} and worker.alive()
