"""CARMY_QUEUE_TIMEOUT: a call that waits in the queue past it ends as TIMEOUT and never runs."""

from __future__ import annotations

import time

import httpx

from tests.support import Call, Stack, wait_until


def test_call_queued_past_the_queue_timeout_times_out_and_never_runs(fresh_stack: Stack) -> None:
    stack = fresh_stack
    stack.worker(env={"CARMY_CONCURRENCY": "1"})
    _, base = stack.api({"CARMY_QUEUE_TIMEOUT": "1"})
    wait_until(lambda: "linger" in httpx.get(base + "/agent/tools").text)
    busy = Call(base, {"tool": "linger", "arguments": {"seconds": 3, "tag": "busy"}})
    wait_until((stack.tmp / "linger-start-busy").exists, 5)

    start = time.monotonic()
    r = httpx.post(base + "/agent/execute", json={"tool": "linger", "arguments": {"seconds": 0.1, "tag": "late"}},
                   timeout=30)
    waited = time.monotonic() - start
    assert r.status_code == 504, r.text
    body = r.json()
    assert body["status"] == "timed_out"
    assert body["error"]["code"] == "TIMEOUT"
    assert "never ran" in body["error"]["message"]
    # Settled by a janitor (one sweep a second) once the 1 s queue timeout passed, not when the
    # worker came free (3 s) nor after the tool's own 30 s timeout.
    assert 0.95 <= waited <= 2.8, waited

    assert busy.result().status_code == 200
    time.sleep(0.5)  # the worker is free now and has seen the late job
    assert not (stack.tmp / "linger-start-late").exists(), "a call answered as never started ran anyway"
