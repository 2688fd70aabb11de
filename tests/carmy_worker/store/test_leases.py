"""What a LEASE tells of its queue besides the jobs it took: how many are still due and not
leased, the count a worker's hints of where work is rest on (store.hints)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio

from carmy_worker.store import jobs, keys
from carmy_worker.store.leases import HANDOFF_LOOK_AHEAD, Leases
from carmy_worker.store.scripts import run
from carmy_worker.store.submit import Submit
from carmy_worker.wire import ExecutionJob

GROUP = "lease-test"


async def lease_one(client: redis.asyncio.Redis, queue: str) -> list[Any]:
    """The reply of the LEASE a SETTLE carries: one job, looking HANDOFF_LOOK_AHEAD jobs down."""
    handoff = Leases(client, "w0").hand_over(lease_ms=60_000, look_ahead=HANDOFF_LOOK_AHEAD,
                                             wanted=lambda: queue, on_taken=lambda _: None)
    call = handoff.make()
    assert call is not None
    script, keys_, args = call
    reply: list[Any] = await run(client, script, keys_, args)
    return reply


@pytest.mark.parametrize("queued", [HANDOFF_LOOK_AHEAD - 1, HANDOFF_LOOK_AHEAD + 2])
async def test_a_lease_counts_the_jobs_still_due_whether_or_not_it_read_them_all(
    ar: redis.asyncio.Redis, sync_redis: redis.Redis, queued: int,
) -> None:
    """Fewer due jobs than it looks at: it read them all, and counts them itself; more: Redis
    counts them. Either way the count is what is due and not leased after it, a job another lease
    holds included (it is due: only its lease's end keeps it from another worker)."""
    partition = keys.partition_count() - 1
    queue = jobs.queue_name(GROUP, partition)
    submit = Submit(ar, retention=600)
    for _ in range(queued):
        job = ExecutionJob(execution_id=keys.new_execution_id(partition), tool="noop", arguments=b"{}")
        got = await submit(job, group=GROUP, idempotent=True, workers_alive=True, max_pending=100,
                           queue_wait_ms=60_000, admission_ms=60_000)
        assert got.kind == "new"
    head = sync_redis.zrange(queue, 0, 0)[0].decode()
    sync_redis.set(jobs.in_progress_key(head), "another worker's token", px=60_000)

    reply = await lease_one(ar, queue)

    assert len(reply) == 7 and reply[0].decode() != head  # one job taken, not the held one
    seconds, micros = sync_redis.time()
    assert reply[-1] == queued - 1 == sync_redis.zcount(queue, "-inf", seconds * 1000 + micros // 1000)
