"""The job loop's room at many partitions: a group's queues together hold at most ``room``
executions of jobs, wherever the due jobs are, so that jobs run as promptly at 16 partitions as at
one. A room shared out as a fixed ``room / N`` per partition held the jobs of one partition (a
principal's with a quota, all in its home partition) to a sixteenth of the pace: in the chaos
check on a 16-partition cluster, jobs ran more than a minute late and were still queued at the end.
The callback loop's batch likewise is ``AT_ONCE`` over every partition, not a fixed share of it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from carmy_worker.jobs.callbacks import AT_ONCE, CallbackLoop
from carmy_worker.jobs.driver import JobLoop
from carmy_worker.settings import NotifySettings, WorkerSettings
from carmy_worker.store import jobs, keys, records
from carmy_worker.store.attempts import Attempts
from carmy_worker.store.jobstore import JobStore
from tests.carmy_worker.jobs.test_callbacks import SECRET, pending
from tests.carmy_worker.jobs.test_driver import GROUP, PRINCIPALS, TOOLS, make_job

ROOM = 8
RUN_S = 0.05  # how long each execution "runs" in the worker below
JOBS = 160  # three quarters of them of one principal, in its home partition


@pytest.fixture
def partition_count() -> Iterator[None]:
    """Restores the test process's partition count after a test that changes it."""
    before = keys.partition_count()
    try:
        yield
    finally:
        keys.use_partitions(before)


class Worker:
    """A worker with as many slots as it needs whose every execution takes ``RUN_S``: each round
    it takes what its group's queues hold, runs it, and settles it (its record, its queue entry
    gone, as a lease ends). It notes the most executions the queues held at once, together and
    in any one partition."""

    def __init__(self, ar: redis.asyncio.Redis) -> None:
        self.ar = ar
        self.peak = 0
        self.one_partitions_peak = 0

    async def run(self) -> None:
        attempts = Attempts(self.ar, worker_id="w1", retention=60, group=GROUP)
        while True:
            queued = [(queue, raw.decode()) for queue in (jobs.queue_name(GROUP, p) for p in keys.partitions())
                      for raw in await self.ar.zrange(queue, 0, -1)]
            self.peak = max(self.peak, len(queued))
            self.one_partitions_peak = max([self.one_partitions_peak, *Counter(q for q, _ in queued).values()])
            await asyncio.sleep(RUN_S)
            for queue, exec_id in queued:
                record = records.completed(exec_id, "mirror", b'{"ok":true}', cacheable=False, duration_ms=1)
                await attempts.settle(record, exec_id=exec_id, attempt=0, ran=False)
                await self.ar.zrem(queue, exec_id)


async def all_jobs_run(ar: redis.asyncio.Redis, count: int) -> int:
    """Over ``count`` partitions: the most executions one partition's queue held at once, from JOBS
    due jobs to all of them succeeded, with one job loop and the worker above; asserts the queues
    never held more than the room."""
    await ar.flushall()
    keys.use_partitions(count)
    principals = [PRINCIPALS[0] if n % 4 else PRINCIPALS[n // 4 % len(PRINCIPALS)] for n in range(JOBS)]
    job_ids = [await make_job(ar, "mirror", idempotent=True, principal=p) for p in principals]
    if count > 1:  # one partition holds most of them, and every principal's partition some
        assert len({keys.partition_of(j) for j in job_ids}) > 1
    one, worker, store = JobLoop(ar, tools=TOOLS, group=GROUP, settings=WorkerSettings(), room=ROOM), Worker(ar), \
        JobStore(ar)
    tasks = [asyncio.create_task(one.run()), asyncio.create_task(worker.run())]
    began = time.monotonic()
    try:
        while not all(job is not None and job.status == "succeeded" for job in await store.read_many(job_ids)):
            if time.monotonic() - began > 60:
                raise TimeoutError(f"{JOBS} jobs over {count} partitions not all run within 60 s")
            await asyncio.sleep(0.02)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert worker.peak <= ROOM  # one loop: its group's queues together never hold more than its room
    return worker.one_partitions_peak


@pytest.mark.usefixtures("partition_count")
@pytest.mark.slow
async def test_jobs_run_as_promptly_at_sixteen_partitions_as_at_one(ar: redis.asyncio.Redis) -> None:
    assert await all_jobs_run(ar, 1) > ROOM // 2
    # At a fixed share of ROOM / 16 per partition the jobs of the busy partition went one per
    # round (over ten times as long, as a time taken showed, but a busy machine's time says little):
    # once the others' are done, the whole room is the busy partition's.
    assert await all_jobs_run(ar, 16) > ROOM // 2


@pytest.mark.usefixtures("partition_count")
async def test_a_callback_loops_pass_takes_its_whole_batch_from_one_partition(ar: redis.asyncio.Redis) -> None:
    keys.use_partitions(16)
    job_ids = [keys.new_job_id(5) for _ in range(AT_ONCE + AT_ONCE // 2)]
    for n, job_id in enumerate(job_ids):
        await pending(ar, job_id)
        # Each to a receiver of its own, on a host not allowed: each attempt ends it at once.
        await ar.hset(keys.job(job_id), "notify_url", f"http://x{n}/")
    loop = CallbackLoop(ar, NotifySettings(secret=SECRET, hosts=("allowed.example",)))
    assert await loop.tick() == AT_ONCE  # a share of AT_ONCE / 16 each took 4
    await loop.idle()
    assert await loop.tick() == AT_ONCE // 2
    await loop.idle()
    assert await ar.zcard(keys.callbacks_due(5)) == 0
