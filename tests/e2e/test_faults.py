"""Faults that once left executions wrong or waiting: a worker paused past its reaping, a worker
that died between taking a job and claiming it, a lock holder paused past its lease, and Redis
down for longer than ``dead_after``. Real processes, side effects counted in files."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
import redis
import redis.asyncio

from carmy_worker.runtime import lock
from carmy_worker.runtime.presence import FULL_EVERY
from carmy_worker.runtime.queue import Leases
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import jobs, keys
from carmy_worker.store.roster import Liveness
from tests.conftest import private_stack
from tests.support import Call, Proc, RedisServer, Stack, marked, wait_until

DEAD_AFTER = WorkerSettings().dead_after
HEARTBEAT_S = WorkerSettings().heartbeat


def ready(stack: Stack, tool: str, **worker_env: str) -> tuple[Proc, str]:
    worker = stack.worker(env=worker_env or None)
    _, base = stack.api()
    wait_until(lambda: tool in httpx.get(base + "/agent/tools").text)
    return worker, base


def lines(stack: Stack, name: str) -> list[str]:
    path = stack.tmp / name
    return path.read_text().splitlines() if path.exists() else []


def test_a_worker_paused_past_its_reaping_runs_the_execution_again_itself(
    fresh_stack: Stack, sync_redis: redis.Redis,
) -> None:
    """The only worker is paused; the API's janitor puts its idempotent execution back in the
    queue. On waking, the worker stops the old run and takes the job again: one run at a time,
    and the execution settles (it used to stay "running" with no job, for good)."""
    worker, base = ready(fresh_stack, "tally_idem")
    call = Call(base, {"tool": "tally_idem", "arguments": {"name": "alone", "seconds": 3}})
    exec_id = marked(fresh_stack.tmp / "tally-idem-alone").strip()
    worker.signal(signal.SIGSTOP)
    wait_until(lambda: sync_redis.hget(keys.execution(exec_id), "state") == b"queued", DEAD_AFTER + 20)
    worker.signal(signal.SIGCONT)
    r = call.result()
    assert r.status_code == 200, r.text
    assert r.json()["data"] == {"n": 2}
    assert [line.split()[1] for line in lines(fresh_stack, "tally-idem-done-alone")] == ["2"]
    assert "KeyError" not in worker.output()
    assert not sync_redis.exists(jobs.job_key(exec_id))


def test_a_job_leased_by_a_worker_that_died_before_claiming_it_runs_within_seconds(
    fresh_stack: Stack, sync_redis: redis.Redis,
) -> None:
    """A worker dies after LEASE and before CLAIM: the job is put back on heartbeat evidence,
    not when arq's in-progress key runs out (the longest tool timeout plus 25 s)."""
    _, base = ready(fresh_stack, "tally_idem", CARMY_CONCURRENCY="1")
    busy = Call(base, {"tool": "tally_idem", "arguments": {"name": "busy", "seconds": 6}})
    busy_id = marked(fresh_stack.tmp / "tally-idem-busy").strip()  # the real worker's only slot is taken
    target = Call(base, {"tool": "tally_idem", "arguments": {"name": "target", "seconds": 0}})
    busy_queue = sync_redis.hget(keys.execution(busy_id), "wake").decode().removesuffix(":wake")
    # The group's queue in every partition: the target is queued in its own execution's.
    group = busy_queue.removeprefix(keys.partition_prefix(keys.partition_of_key(busy_queue)))
    queues = [keys.partition_prefix(p) + group for p in keys.partitions()]

    def target_queue() -> str | None:
        return next((q for q in queues if {m.decode() for m in sync_redis.zrange(q, 0, -1)} - {busy_id}), None)

    async def lease_and_die(queue: str) -> str:
        client = redis.asyncio.Redis.from_url(fresh_stack.redis_url)
        try:
            await Liveness(client, dead_after=DEAD_AFTER).heartbeat("doomed")
            [lease] = await Leases(client, "doomed").take(queue, most=1, lease_ms=120_000, look_ahead=10)
            return lease.job_id
        finally:
            await client.aclose()

    exec_id = wait_until(lambda: (queue := target_queue()) is not None and asyncio.run(lease_and_die(queue)))
    died_at = time.monotonic()
    assert sync_redis.pttl(jobs.in_progress_key(str(exec_id))) > 100_000
    r = target.result(30)
    assert r.status_code == 200, r.text
    assert target.finished_at - died_at < DEAD_AFTER + 8  # was ~2 minutes with this lease
    assert busy.result().status_code == 200


def test_a_paused_lock_holder_never_overlaps_the_next_holder(fresh_stack: Stack, sync_redis: redis.Redis) -> None:
    """``parallel_safe=False``: the holder is paused past its lock's lease, another worker takes
    the execution and the lock; the paused one, continued, stops before its next step."""
    stack = fresh_stack
    workers = [stack.worker(), stack.worker()]
    _, base = stack.api()
    wait_until(lambda: "exclusive" in httpx.get(base + "/agent/tools").text)
    call = Call(base, {"tool": "exclusive", "arguments": {"seconds": 2}})
    holder_id = wait_until(lambda: sync_redis.get(keys.lock("exclusive")))
    exec_id = bytes(holder_id).decode().split("/")[0]
    owner = wait_until(lambda: sync_redis.hget(keys.execution(exec_id), "worker"))
    [paused] = [w for w in workers if f"-{w.pid}-" in bytes(owner).decode()]
    paused.signal(signal.SIGSTOP)
    # Reaped (it is idempotent: back in the queue), and run by the other worker once the lock's
    # lease has run out.
    r = call.result(DEAD_AFTER + lock.LEASE_S + 20)
    assert r.status_code == 200, r.text
    paused.signal(signal.SIGCONT)
    wait_until(lambda: "outcome of attempt 1 is dropped" in paused.output())
    assert len(lines(stack, "exclusive")) == 1  # only the rerun took its step: the paused one never did


@pytest.fixture
def durable_stack() -> Iterator[tuple[RedisServer, Stack]]:
    with private_stack(durable=True, fsync="always") as pair:
        yield pair


def test_calls_in_flight_keep_their_outcome_through_a_redis_outage_longer_than_dead_after(
    durable_stack: tuple[RedisServer, Stack],
) -> None:
    """Redis is down for longer than dead_after while a non-idempotent tool runs: its worker was
    alive throughout, so the call gets the tool's answer, not EXECUTION_UNCERTAIN; and calls made
    as soon as Redis is back are not refused with NO_WORKERS."""
    server, stack = durable_stack
    worker, base = ready(stack, "tally")
    call = Call(base, {"tool": "tally", "arguments": {"name": "outage", "seconds": 1}, "request_id": "outage"})
    marked(stack.tmp / "tally-outage")
    with server.client() as client:
        watched_since = client.hget(keys.watch(0), "since")
    server.stop()
    down_at = time.monotonic()
    wait_until(lambda: time.monotonic() - down_at > DEAD_AFTER + 1.5, what="an outage longer than dead_after")
    # The worker stays silent after Redis is back (as a busy one may) until the API has judged
    # liveness again: its first look after the gap starts the grace, and only the grace keeps the
    # silent worker alive (without it, its heartbeat is 4.5 s old: reaped, NO_WORKERS).
    worker.signal(signal.SIGSTOP)
    server.start()
    with server.client() as client:
        wait_until(lambda: client.hget(keys.watch(0), "since") != watched_since,
                   what="the API's first look after the gap")
        looked_at = time.monotonic()
        wait_until(lambda: time.monotonic() - looked_at > 0.5, what="the API's view of the silent worker")
    worker.signal(signal.SIGCONT)
    answers = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        reply = httpx.post(base + "/agent/execute", json={"tool": "noop"}, timeout=30)
        answers.append(reply.json().get("error", {}).get("code"))
        if reply.status_code == 200:
            break
        time.sleep(0.05)
    assert "NO_WORKERS" not in answers, answers
    assert answers[-1] is None, answers
    r = call.result(60)
    assert r.status_code == 200, r.text
    assert r.json()["data"] == {"n": 1}
    assert len(lines(stack, "tally-done-outage")) == 1


def test_an_execution_listed_on_a_live_worker_that_does_not_hold_it_is_settled(
    fresh_stack: Stack, sync_redis: redis.Redis,
) -> None:
    """What a Redis crash that took a SETTLE leaves behind: an execution "running" on a live
    worker that finished it long ago. Two of that worker's full heartbeats find it (one in
    ``FULL_EVERY``, the next confirms), and it is settled. (A real crash changes Redis's epoch,
    and the first beat after it is a full one: written by hand here, it is found by the next due.)"""
    ready(fresh_stack, "tally")
    [worker_id] = [w.decode() for w in sync_redis.zrange(keys.workers(0), 0, -1)]
    exec_id = keys.new_execution_id()
    sync_redis.hset(keys.execution(exec_id), mapping={
        "tool": "tally", "state": "running", "attempt": 1, "worker": worker_id, "idem": 0, "owner": "x"})
    sync_redis.sadd(keys.running(worker_id, keys.partition_of(exec_id)), exec_id)
    raw = wait_until(lambda: sync_redis.get(keys.record(exec_id)), (FULL_EVERY + 1) * HEARTBEAT_S + DEAD_AFTER + 10)
    assert b"EXECUTION_UNCERTAIN" in bytes(raw)
    assert not sync_redis.sismember(keys.running(worker_id, keys.partition_of(exec_id)), exec_id)


def test_a_call_whose_worker_died_while_it_waited_for_the_tool_lock_runs_elsewhere(fresh_stack: Stack) -> None:
    """``parallel_safe=False`` and not idempotent: its worker is killed while the call waits for
    the lock, before the tool began. It is not uncertain: another worker runs it, once."""
    stack = fresh_stack
    holder_worker, base = ready(stack, "exclusive_slow", CARMY_CONCURRENCY="1")
    holder = Call(base, {"tool": "exclusive_slow", "arguments": {"seconds": 8, "tag": "holder"}})
    marked(stack.tmp / "exclusive-slow-start-holder")  # the only slot of the first worker is taken
    waiter_worker = stack.worker()
    waiter = Call(base, {"tool": "exclusive_slow", "arguments": {"seconds": 0, "tag": "waiter"}})
    client = redis.Redis.from_url(stack.redis_url)
    try:
        # The waiter is claimed by the second worker (it is running there, the tool not begun).
        waiter_id = worker_id(client, waiter_worker)
        wait_until(lambda: sum(client.scard(keys.running(waiter_id, p)) for p in keys.partitions()) == 1)
    finally:
        client.close()
    waiter_worker.kill()
    r = waiter.result(DEAD_AFTER + 20)
    assert r.status_code == 200, r.text
    assert holder.result().status_code == 200
    [(_, pid)] = [line.split() for line in lines(stack, "exclusive-slow-start-waiter")]
    assert int(pid) == holder_worker.pid  # run once, by the surviving worker


def worker_id(client: redis.Redis, worker: Proc) -> str:
    return next(w.decode() for w in client.zrange(keys.workers(0), 0, -1) if f"-{worker.pid}-" in w.decode())
