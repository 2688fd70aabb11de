"""``parallel_safe=False`` across workers when the holder of the tool is killed mid-run: the
next caller waits for the lock's lease to run out, no longer and no shorter."""

from __future__ import annotations

import time

import httpx
import redis

from carmy_worker.runtime import lock
from carmy_worker.store import keys
from tests.support import Call, Stack, marked, wait_until


def started(stack: Stack, tag: str) -> tuple[float, int]:
    """When and in which process ``exclusive_slow`` with ``tag`` started."""
    at, pid = marked(stack.tmp / f"exclusive-slow-start-{tag}").split()
    return float(at), int(pid)


def test_killed_lock_holder_lets_the_next_caller_run_after_the_lease(
    fresh_stack: Stack, sync_redis: redis.Redis,
) -> None:
    stack = fresh_stack
    workers = [stack.worker(), stack.worker()]
    _, base = stack.api()
    wait_until(lambda: "exclusive_slow" in httpx.get(base + "/agent/tools").text)
    holder_call = Call(base, {"tool": "exclusive_slow", "arguments": {"seconds": 15, "tag": "holder"}})
    _, holder_pid = started(stack, "holder")
    [holder] = [w for w in workers if w.pid == holder_pid]
    [survivor] = [w for w in workers if w.pid != holder_pid]

    killed_at = time.time()
    holder.kill()
    # The lease left on the dead holder's lock (it can only have been renewed before the kill).
    lease_ends = time.time() + sync_redis.pttl(keys.lock("exclusive_slow")) / 1000
    assert lease_ends - killed_at > lock.LEASE_S / 2
    next_call = Call(base, {"tool": "exclusive_slow", "arguments": {"seconds": 0.2, "tag": "next"}})

    r = next_call.result(lock.LEASE_S + 5)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed"
    at, pid = started(stack, "next")
    assert pid == survivor.pid
    assert at >= lease_ends - 0.05, "the next caller ran while the dead holder's lease still held the tool"
    assert at - killed_at >= lock.LEASE_S * 2 / 3 - 0.1  # it waited, at least what a renewal leaves
    assert at <= lease_ends + 1.0  # and took the tool as soon as the lease ran out
    assert time.time() - killed_at < lock.LEASE_S + 3

    # The interrupted holder is not idempotent: its caller learns it may or may not have run.
    held = holder_call.result(10)
    assert held.status_code == 409
    assert held.json()["error"]["code"] == "EXECUTION_UNCERTAIN"
