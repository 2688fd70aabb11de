"""Job loops against a real Redis, without workers to run what they promote: schedules fired once
by several loops at once, and an attempt whose execution Redis lost concluded all the same."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence

import redis
import redis.asyncio

from carmy_worker.jobs.driver import JobLoop
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import jobs, keys
from carmy_worker.store.jobstore import JobStore, job_fields
from carmy_worker.wire import ExecutionJob, RetryPolicy, ScheduleSpec, ToolSpec, WorkerTool, msgpack_encoder
from tests.support import wait_until_async

QUEUE = jobs.queue_name("g", 0)  # the job loop promotes into partition 0's queue for now
SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}


def tool(name: str, *, idempotent: bool) -> WorkerTool:
    spec = ToolSpec(name=name, description="d", input_schema=SCHEMA, output_schema={}, effect="write",
                    idempotent=idempotent, parallel_safe=True, confirmation="none")
    return WorkerTool(spec=spec, timeout=5.0, retry=RetryPolicy(max_attempts=3, backoff=0.05, max_backoff=0.05))


TOOLS = [tool("tick", idempotent=False), tool("mirror", idempotent=True)]


def loop(ar: redis.asyncio.Redis, schedules: Sequence[ScheduleSpec] = ()) -> JobLoop:
    return JobLoop(ar, tools=TOOLS, queue=QUEUE, settings=WorkerSettings(), schedules=schedules)


async def scheduled_jobs(ar: redis.asyncio.Redis) -> list[str]:
    """The request ids of the jobs the schedule queued."""
    ids = [raw.decode() for raw in await ar.zrange(keys.JOBS_ALL, 0, -1)]
    return [(await ar.hget(keys.job(i), "request_id")).decode() for i in ids]


async def test_three_loops_fire_each_occurrence_of_a_schedule_once(ar: redis.asyncio.Redis,
                                                                   sync_redis: redis.Redis) -> None:
    every_second = ScheduleSpec(name="s", cron="* * * * * *", tool="tick", grace=30)
    loops = [loop(ar, [every_second]) for _ in range(3)]
    tasks = [asyncio.create_task(one.run()) for one in loops]
    try:
        await wait_until_async(lambda: sync_redis.zcard(keys.JOBS_ALL) >= 3, what="three occurrences")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    fired = await scheduled_jobs(ar)
    assert not [rid for rid, n in collections.Counter(fired).items() if n > 1]
    assert all(rid.startswith("schedule:s@") for rid in fired)
    state = await ar.hgetall(keys.schedule("s"))
    assert int(state[b"fired"]) == len(fired) and b"skipped" not in state


async def test_occurrences_missed_past_their_grace_are_skipped_and_counted(ar: redis.asyncio.Redis) -> None:
    every_second = ScheduleSpec(name="late", cron="* * * * * *", tool="tick", grace=1)
    one = loop(ar, [every_second])
    await one.tick()  # the schedule waits for its next occurrence
    waited = int(await ar.hget(keys.schedule("late"), "next"))
    # As if every worker had been down for a minute: the occurrence waited for is long past.
    await ar.hset(keys.schedule("late"), "next", waited - 60_000)
    one._schedules[0].next_ms = waited - 60_000
    await one.tick()
    state = await ar.hgetall(keys.schedule("late"))
    assert int(state[b"skipped"]) >= 55  # run late in a burst: never; at most the grace's worth fires
    assert int(state[b"fired"]) <= 3


async def make_job(ar: redis.asyncio.Redis, name: str, *, idempotent: bool) -> str:
    template = ExecutionJob(execution_id="", tool=name, arguments=b"{}")
    fields = job_fields(tool=name, owner=keys.owner(None), payload=msgpack_encoder.encode(template),
                        policy=RetryPolicy(backoff=0.05), max_attempts=3, idempotent=idempotent, retention=60,
                        dead_retention=60, request_id=None)
    created = await JobStore(ar).create(job_id=keys.new_job_id(), tool=name, owner=keys.owner(None), fields=fields,
                                        idempotency=None, fingerprint="", run_at_ms=None, delay_ms=0,
                                        horizon_ms=10_000, max_open=0)
    return created.job_id


async def test_an_attempt_whose_execution_redis_lost_is_concluded(ar: redis.asyncio.Redis) -> None:
    one = loop(ar)
    tick_job, mirror_job = await make_job(ar, "tick", idempotent=False), await make_job(ar, "mirror", idempotent=True)
    await one.tick()  # promoted onto the queue; no worker runs them
    lost = {}
    for job_id in (tick_job, mirror_job):
        exec_id = (await ar.hget(keys.job(job_id), "exec")).decode()
        lost[job_id] = exec_id
        await ar.delete(keys.execution(exec_id), jobs.job_key(exec_id))
        await ar.zadd(keys.JOBS_RUNNING, {f"{exec_id} {job_id}": 0})  # promoted long ago
    one._lost_at = 0.0
    await one.tick()
    store = JobStore(ar)
    tick_state, mirror_state = await store.read(tick_job), await store.read(mirror_job)
    assert tick_state is not None and mirror_state is not None
    assert tick_state.status == "dead_lettered"  # not idempotent: never run again by itself
    assert mirror_state.status == "queued" and mirror_state.attempts == 1  # idempotent: tried again
    assert await ar.zcard(keys.JOBS_RUNNING) == 0
