"""A ``parallel_safe=False`` tool's lock (runtime.lock over store.locks), against the real Redis,
with one partition and with four: the lock is in a slot of its own, so executions of every
partition contend for one key, and the tool never runs twice at once; an attempt given away
takes nothing and marks nothing; a holder whose lease went to another cannot renew it."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from carmy_worker.runtime.lock import ToolLock
from carmy_worker.store import keys
from carmy_worker.store.locks import ToolLocks
from carmy_worker.store.roster import lock_holder
from tests.cells import cells  # noqa: F401 (a fixture)

WORKERS = ("w0", "w1", "w2")


async def claimed(ar: redis.asyncio.Redis, exec_id: str, worker_id: str, attempt: int = 1) -> None:
    """The execution's hash as CLAIM leaves it when it gives ``attempt`` to ``worker_id`` (what
    BEGIN checks); written directly so that every partition's executions can be set up here."""
    await ar.hset(keys.execution(exec_id), mapping={"tool": "tally", "attempt": attempt, "state": "running",
                                                    "worker": worker_id})


@pytest.mark.usefixtures("cells")
async def test_a_tool_that_is_not_parallel_safe_never_runs_twice_at_once(
        sync_redis: redis.Redis, ar: redis.asyncio.Redis) -> None:
    executions = [keys.new_execution_id(i % keys.partition_count()) for i in range(12)]
    for i, exec_id in enumerate(executions):
        await claimed(ar, exec_id, WORKERS[i % len(WORKERS)])
    locks = {worker_id: ToolLocks(ar, worker_id=worker_id) for worker_id in WORKERS}
    never = asyncio.Event()
    inside, most, ran = 0, 0, []

    async def run(i: int, exec_id: str) -> None:
        nonlocal inside, most
        lock = ToolLock(locks[WORKERS[i % len(WORKERS)]], "tally", exec_id, 1)
        assert await lock.acquire(20, never) == "taken"
        inside += 1
        most = max(most, inside)
        for _ in range(3):  # the tool's work: round trips, while the others keep trying
            assert await ar.get(keys.lock("tally")) == lock_holder(exec_id, 1).encode()
        inside -= 1
        ran.append(exec_id)
        await lock.release()

    await asyncio.gather(*(run(i, exec_id) for i, exec_id in enumerate(executions)))
    assert most == 1 and sorted(ran) == sorted(executions)
    assert all(sync_redis.hget(keys.execution(x), "began") == b"1" for x in executions)
    assert not sync_redis.exists(keys.lock("tally"))
    assert keys.lock("tally") == "carmy:{lock:tally}"
    assert key_slot(keys.lock("tally").encode()) not in {key_slot(keys.partition_prefix(p).encode())
                                                         for p in keys.partitions()}


@pytest.mark.usefixtures("cells")
async def test_an_attempt_given_away_takes_nothing_and_marks_nothing(
        sync_redis: redis.Redis, ar: redis.asyncio.Redis) -> None:
    never = asyncio.Event()
    for partition in keys.partitions():
        exec_id = keys.new_execution_id(partition)
        await claimed(ar, exec_id, "w1", attempt=2)  # attempt 1 was reaped while w1 was paused
        locks = ToolLocks(ar, worker_id="w1")
        assert await ToolLock(locks, "tally", exec_id, 1).acquire(1, never) == "lost"
        assert not sync_redis.exists(keys.lock("tally"))
        assert sync_redis.hget(keys.execution(exec_id), "began") is None
        assert await locks.take("tally", exec_id, 2, lease_ms=5000) == "taken"  # the current one may
        await locks.release("tally", exec_id, 2)


@pytest.mark.usefixtures("cells")
async def test_a_holder_whose_lease_went_to_another_cannot_renew(
        sync_redis: redis.Redis, ar: redis.asyncio.Redis) -> None:
    stale, current = keys.new_execution_id(0), keys.new_execution_id(keys.partition_count() - 1)
    await claimed(ar, stale, "w1")
    await claimed(ar, current, "w2")
    one, two = ToolLocks(ar, worker_id="w1"), ToolLocks(ar, worker_id="w2")
    assert await one.take("tally", stale, 1, lease_ms=5000) == "taken"
    assert await two.take("tally", current, 1, lease_ms=5000) == "held"
    sync_redis.delete(keys.lock("tally"))  # as its lease runs out while w1 is paused
    assert await two.take("tally", current, 1, lease_ms=5000) == "taken"
    assert not await one.renew("tally", stale, 1, lease_ms=5000)
    assert not await one.release("tally", stale, 1)
    assert sync_redis.get(keys.lock("tally")) == lock_holder(current, 1).encode()
