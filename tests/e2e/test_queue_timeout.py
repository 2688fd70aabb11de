"""CARMY_QUEUE_TIMEOUT: a call that waits in the queue past it ends as TIMEOUT and never runs."""

from __future__ import annotations

import time

import httpx
import redis

from carmy_worker.store import jobs
from tests.support import Call, Stack, marked, wait_until

BUSY_SECONDS = 6  # how long the one slot is taken: far past the 1 s queue timeout and a janitor sweep


def test_call_queued_past_the_queue_timeout_times_out_and_never_runs(fresh_stack: Stack,
                                                                      sync_redis: redis.Redis) -> None:
    stack = fresh_stack
    stack.worker(env={"CARMY_CONCURRENCY": "1"})
    _, base = stack.api({"CARMY_QUEUE_TIMEOUT": "1"})
    wait_until(lambda: "linger" in httpx.get(base + "/agent/tools").text)
    busy = Call(base, {"tool": "linger", "arguments": {"seconds": BUSY_SECONDS, "tag": "busy"}})
    marked(stack.tmp / "linger-start-busy")

    start = time.monotonic()
    r = httpx.post(base + "/agent/execute", json={"tool": "linger", "arguments": {"seconds": 0.1, "tag": "late"}},
                   timeout=30)
    waited = time.monotonic() - start
    # Settled by a janitor (one sweep a second) once the 1 s queue timeout passed: not when the
    # worker came free, nor after the tool's own 30 s timeout.
    assert busy.response is None, "answered only once the worker came free"
    assert r.status_code == 504, r.text
    body = r.json()
    assert body["status"] == "timed_out"
    assert body["error"]["code"] == "TIMEOUT"
    assert "never ran" in body["error"]["message"]
    assert 0.95 <= waited < BUSY_SECONDS, waited

    assert busy.result().status_code == 200
    # The worker is free now: it takes the late job (arq's job key goes when it is done with
    # it), finds the execution settled and drops it without running the tool.
    wait_until(lambda: not sync_redis.exists(jobs.job_key(body['execution_id'])))
    assert not (stack.tmp / "linger-start-late").exists(), "a call answered as never started ran anyway"
