"""A worker stops on SIGTERM even when a tool left a thread running for ever: a sync tool that
never returned (its caller answered ``TIMEOUT`` long before), or a thread a tool started. Python's
exit joins such threads, and held the drained worker there, deregistered and serving nothing,
until someone killed it."""

from __future__ import annotations

import signal
import time
import uuid

import httpx

from tests.support import Stack, wait_until
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
