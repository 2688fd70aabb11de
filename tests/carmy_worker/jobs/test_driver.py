"""Job loops against a real Redis, without workers to run what they promote: schedules fired once
by several loops at once, and an attempt whose execution Redis lost concluded all the same."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import pytest
import redis
import redis.asyncio

from carmy_worker.jobs.driver import JobLoop
from carmy_worker.sdk.errors import ToolError
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import jobs, keys, records
from carmy_worker.store.attempts import Attempts
from carmy_worker.store.jobstore import JobStore, job_fields
from carmy_worker.store.quota import Quota
from carmy_worker.wire import ExecutionJob, Record, RetryPolicy, ScheduleSpec, ToolSpec, WorkerTool, msgpack_encoder
from tests.cells import cells  # noqa: F401 (a fixture)
from tests.support import wait_until_async

pytestmark = pytest.mark.usefixtures("cells")

GROUP = "g"
SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}


def tool(name: str, *, idempotent: bool) -> WorkerTool:
    spec = ToolSpec(name=name, description="d", input_schema=SCHEMA, output_schema={}, effect="write",
                    idempotent=idempotent, parallel_safe=True, confirmation="none")
    return WorkerTool(spec=spec, timeout=5.0, retry=RetryPolicy(max_attempts=3, backoff=0.05, max_backoff=0.05))


TOOLS = [tool("tick", idempotent=False), tool("mirror", idempotent=True)]


def loop(ar: redis.asyncio.Redis, schedules: Sequence[ScheduleSpec] = ()) -> JobLoop:
    return JobLoop(ar, tools=TOOLS, group=GROUP, settings=WorkerSettings(), schedules=schedules)


async def scheduled_jobs(ar: redis.asyncio.Redis) -> list[str]:
    """The request ids of the jobs the schedule queued."""
    ids = [raw.decode() for p in keys.partitions() for raw in await ar.zrange(keys.jobs_all(p), 0, -1)]
    return [(await ar.hget(keys.job(i), "request_id")).decode() for i in ids]


@pytest.mark.slow
async def test_three_loops_fire_each_occurrence_of_a_schedule_once(ar: redis.asyncio.Redis,
                                                                   sync_redis: redis.Redis) -> None:
    every_second = ScheduleSpec(name="s", cron="* * * * * *", tool="tick", grace=30)
    loops = [loop(ar, [every_second]) for _ in range(3)]
    tasks = [asyncio.create_task(one.run()) for one in loops]
    try:
        every = keys.jobs_all(keys.schedule_partition("s"))  # the schedule's jobs are in its partition
        await wait_until_async(lambda: sync_redis.zcard(every) >= 3, what="three occurrences")
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


@pytest.mark.slow
async def test_a_schedule_whose_newer_definition_stopped_is_taken_over_by_the_older(ar: redis.asyncio.Redis,
                                                                                      sync_redis: redis.Redis) -> None:
    # A rolling deploy rolled back: a worker with a new definition took the schedule up, then
    # stopped; the old workers go on. They fired nothing again, polling Redis every 5 ms.
    old = loop(ar, [ScheduleSpec(name="canary", cron="* * * * * *", tool="tick", grace=1)])
    await old.tick()
    await loop(ar, [ScheduleSpec(name="canary", cron="* * * * * *", tool="mirror", grace=1)]).tick()
    fires = 0
    fire = old._promotions.fire

    async def counted(**kwargs: Any) -> Any:
        nonlocal fires
        fires += 1
        return await fire(**kwargs)

    old._promotions.fire = counted  # type: ignore[method-assign]
    task = asyncio.create_task(old.run())
    every = keys.jobs_all(keys.schedule_partition("canary"))
    try:
        await wait_until_async(lambda: any(sync_redis.hget(keys.job(j.decode()), "tool") == b"tick"
                                           for j in sync_redis.zrange(every, 0, -1)), what="the old definition fired")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert fires < 20  # about once a second while it waited, not at every pass


# A quota keeps each principal's jobs in its home partition (without one they spread at random):
# PRINCIPALS' jobs are then in every partition, whatever the draw.
HOMED = Quota(pending=1_000)


async def make_job(ar: redis.asyncio.Redis, name: str, *, idempotent: bool, principal: str | None = None,
                   delay_ms: int = 0) -> str:
    owner = keys.owner(principal)
    template = ExecutionJob(execution_id="", tool=name, arguments=b"{}", principal=principal)
    fields = job_fields(tool=name, owner=owner, payload=msgpack_encoder.encode(template),
                        policy=RetryPolicy(backoff=0.05), max_attempts=3, idempotent=idempotent, retention=60,
                        dead_retention=60, request_id=None)
    created = await JobStore(ar).create(job_id=JobStore.new_job_id(owner, HOMED), tool=name, owner=owner,
                                        fields=fields, idempotency=None, fingerprint="", run_at_ms=None,
                                        delay_ms=delay_ms, horizon_ms=10_000, max_open=0, quota=HOMED)
    assert created.kind == "new"
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
        await ar.zadd(keys.jobs_running(keys.partition_of(job_id)), {f"{exec_id} {job_id}": 0})  # promoted long ago
    one._lost_at = 0.0
    await one.tick()
    store = JobStore(ar)
    tick_state, mirror_state = await store.read(tick_job), await store.read(mirror_job)
    assert tick_state is not None and mirror_state is not None
    assert tick_state.status == "dead_lettered"  # not idempotent: never run again by itself
    assert mirror_state.status == "queued" and mirror_state.attempts == 1  # idempotent: tried again
    assert sum([await ar.zcard(keys.jobs_running(p)) for p in keys.partitions()]) == 0


class Settler:
    """What the workers would do with the executions the loops promote, without running a tool:
    each one's record, written by SETTLE (as a verdict is, at attempt 0), the outcome ``outcome``
    asks for, once each, and its queue entry gone (as a worker's lease ends with it)."""

    def __init__(self, ar: redis.asyncio.Redis, outcome: collections.abc.Callable[[str], Record]) -> None:
        self.ar, self.outcome = ar, outcome
        self.settled: list[str] = []

    async def settle_queued(self) -> None:
        for partition in keys.partitions():
            queue = jobs.queue_name(GROUP, partition)
            for raw in await self.ar.zrange(queue, 0, -1):
                exec_id = raw.decode()
                if exec_id in self.settled:
                    continue
                assert keys.partition_of(exec_id) == partition  # an execution is queued in its own partition
                attempts = Attempts(self.ar, worker_id="w1", retention=60, group=GROUP)
                assert await attempts.settle(self.outcome(exec_id), exec_id=exec_id, attempt=0, ran=False)
                await self.ar.zrem(queue, exec_id)
                self.settled.append(exec_id)


PRINCIPALS = [f"agent-{n}" for n in range(12)]  # their home partitions cover four partitions


async def run_loops(ar: redis.asyncio.Redis, settler: Settler, job_ids: list[str], *, until: set[str]) -> None:
    """Two job loops and the settler, until every job in ``job_ids`` has a status in ``until``."""
    loops = [loop(ar), loop(ar)]
    store = JobStore(ar)

    async def finished() -> bool:
        await settler.settle_queued()
        return all(job is not None and job.status in until for job in await store.read_many(job_ids))

    tasks = [asyncio.create_task(one.run()) for one in loops]
    try:
        deadline = time.monotonic() + 30
        while not await finished():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the jobs are not all {' or '.join(until)} within 30 s")
            await asyncio.sleep(0.01)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_jobs_of_every_partition_each_run_once_not_before_they_are_due(ar: redis.asyncio.Redis) -> None:
    assert len({keys.home_partition(keys.owner(p)) for p in PRINCIPALS}) == keys.partition_count()
    job_ids = [await make_job(ar, "mirror", idempotent=True, principal=p, delay_ms=200) for p in PRINCIPALS]
    settler = Settler(ar, lambda e: records.completed(e, "mirror", b'{"ok":true}', cacheable=False, duration_ms=1))
    await run_loops(ar, settler, job_ids, until={"succeeded"})
    for job in await JobStore(ar).read_many(job_ids):
        assert job is not None and len(job.executions) == 1 and job.attempts == 1
        [exec_id] = job.executions
        assert keys.partition_of(exec_id) == keys.partition_of(job.job_id)
        queued_at = int(await ar.hget(keys.execution(exec_id), "queued_at"))
        assert queued_at >= job.run_at_ms  # promoted once due, not before
    assert sorted(settler.settled) == sorted(e for job in await JobStore(ar).read_many(job_ids)
                                             for e in (job.executions if job else []))


async def test_retries_then_dead_letters_in_every_partition(ar: redis.asyncio.Redis) -> None:
    job_ids = [await make_job(ar, "mirror", idempotent=True, principal=p) for p in PRINCIPALS]
    busy = ToolError("BUSY", "try later", retryable=True).to_wire()
    settler = Settler(ar, lambda e: records.failed(e, "mirror", busy))
    await run_loops(ar, settler, job_ids, until={"dead_lettered"})
    for job in await JobStore(ar).read_many(job_ids):
        assert job is not None and job.attempts == 3 and len(set(job.executions)) == 3  # max_attempts, each once
    dead = [job_id for p in keys.partitions() for job_id in await ar.zrange(keys.jobs_dead(p), 0, -1)]
    assert sorted(raw.decode() for raw in dead) == sorted(job_ids)


async def test_an_idle_pass_costs_one_look_per_partition(ar: redis.asyncio.Redis,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass with nothing due sends one LOOK per partition; over several partitions, one
    pipeline of queue sizes before them (the room is shared over them); with one partition
    nothing else, one round trip: its LOOK counts what its queue holds itself."""
    one = loop(ar)
    await one.tick()  # the first pass also sweeps what Redis lost (every LOST_EVERY_S)
    connection = ar.connection_pool.connection_class
    send, sent = connection.send_packed_command, 0

    def counted(self: Any, command: Any, check_health: bool = True) -> Any:
        nonlocal sent
        sent += 1
        return send(self, command, check_health)

    monkeypatch.setattr(connection, "send_packed_command", counted)
    await ar.config_resetstat()
    sent = 0
    await one.tick()
    round_trips = sent
    monkeypatch.undo()
    scripts = (await ar.info("commandstats"))["cmdstat_evalsha"]["calls"]
    count = keys.partition_count()
    assert (round_trips, scripts) == ((1, 1) if count == 1 else (1 + count, count))


async def test_a_due_job_whose_promotion_failed_is_promoted_on_the_next_pass(ar: redis.asyncio.Redis,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """LOOK leases a due job to its loop for DUE_LEASE_MS (10 s). A PROMOTE that fails after it
    (a primary failing over, a slot moving) does not leave the job waiting out that lease: the
    loop's next pass in the partition promotes it. Without that, a second every-second schedule
    occurrence ran 10 s late in the chaos check after a slot moved."""
    one = loop(ar)
    one._reach.retry_after_s = 0.0  # a failed partition is tried again on the next pass
    job_id = await make_job(ar, "mirror", idempotent=True)
    promote, failures = one._promotions.promote, 0

    async def refused_once(*args: Any, **kwargs: Any) -> list[str]:
        nonlocal failures
        if not failures:
            failures += 1
            raise redis.exceptions.ConnectionError("Connection closed by server.")
        return await promote(*args, **kwargs)

    monkeypatch.setattr(one._promotions, "promote", refused_once)
    # One Redis: the loop's error (run() logs it, and passes again a second later); several
    # partitions: that partition's alone (store.reach), the others go on.
    with pytest.raises(redis.exceptions.ConnectionError) if keys.partition_count() == 1 else contextlib.nullcontext():
        await one.tick()
    store = JobStore(ar)
    job = await store.read(job_id)
    assert failures == 1 and job is not None and job.status == "queued" and not job.executions
    lease = await ar.zscore(keys.job_due("mirror", keys.partition_of(job_id)), job_id)
    assert lease is not None and lease > job.due_ms + 5_000  # leased: no other LOOK will find it for 10 s
    await one.tick()
    job = await store.read(job_id)
    assert job is not None and job.status == "running" and len(job.executions) == 1 and job.attempts == 1
    assert await ar.zscore(keys.job_due("mirror", keys.partition_of(job_id)), job_id) is None
    assert await ar.zcard(jobs.queue_name(GROUP, keys.partition_of(job_id))) == 1  # one execution, queued once
    await one.tick()
    assert (await store.read(job_id)).executions == job.executions  # type: ignore[union-attr]  # never again


async def test_a_due_job_whose_look_reply_was_lost_is_promoted_on_the_next_pass(ar: redis.asyncio.Redis,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A LOOK that ran but whose reply the loop never read (the connection cut as Redis answered)
    leased its due job all the same, for DUE_LEASE_MS (10 s). The loop's next pass gets it
    again and promotes it, rather than leaving it to wait out that lease; another loop does not."""
    one, other = loop(ar), loop(ar)
    for each in (one, other):
        each._reach.retry_after_s = 0.0  # a failed partition is tried again on the next pass
    job_id = await make_job(ar, "mirror", idempotent=True)
    look, lost = one._promotions.look, 0

    async def reply_lost_once(*args: Any, **kwargs: Any) -> Any:
        nonlocal lost
        found = await look(*args, **kwargs)
        if not lost and found.due:
            lost += 1
            raise redis.exceptions.ConnectionError("Connection closed by server.")
        return found

    monkeypatch.setattr(one._promotions, "look", reply_lost_once)
    with pytest.raises(redis.exceptions.ConnectionError) if keys.partition_count() == 1 else contextlib.nullcontext():
        await one.tick()
    store = JobStore(ar)
    assert lost == 1 and (await store.read(job_id)).status == "queued"  # type: ignore[union-attr]
    lease = await ar.zscore(keys.job_due("mirror", keys.partition_of(job_id)), job_id)
    assert lease is not None and lease > (await store.read(job_id)).due_ms + 5_000  # type: ignore[union-attr]
    await other.tick()  # leased to ``one``: not another loop's
    assert (await store.read(job_id)).status == "queued"  # type: ignore[union-attr]
    await one.tick()
    job = await store.read(job_id)
    assert job is not None and job.status == "running" and len(job.executions) == 1 and job.attempts == 1
    await one.tick()
    await other.tick()
    assert (await store.read(job_id)).executions == job.executions  # type: ignore[union-attr]  # never again


async def test_jobs_kept_for_another_promote_take_room_until_their_lease_ends(ar: redis.asyncio.Redis,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """What a loop keeps to promote again counts against its room, as its queue would once they
    are promoted; past their lease they no longer do (another loop's LOOK may have them)."""
    one = JobLoop(ar, tools=TOOLS, group=GROUP, settings=WorkerSettings(), room=1)
    one._reach.retry_after_s = 0.0
    first = await make_job(ar, "mirror", idempotent=True)
    promote = one._promotions.promote

    async def refused(*args: Any, **kwargs: Any) -> list[str]:
        raise redis.exceptions.ConnectionError("Connection closed by server.")

    monkeypatch.setattr(one._promotions, "promote", refused)
    with contextlib.suppress(redis.exceptions.ConnectionError):
        await one.tick()
    assert one._kept() == 1
    second = await make_job(ar, "mirror", idempotent=True)
    monkeypatch.setattr(one._promotions, "promote", promote)
    await one.tick()  # the room (1) goes to the kept job: the second is not even leased
    store = JobStore(ar)
    assert [job.status for job in await store.read_many([first, second])] == ["running", "queued"]  # type: ignore[union-attr]
    assert await ar.zscore(keys.job_due("mirror", keys.partition_of(second)), second) is not None
    assert one._kept() == 0
    # A job kept past its lease: no room taken, and not sent again from memory.
    one._unpromoted[keys.partition_of(second)] = {("mirror", second): one._now_ms - 1}
    assert one._kept() == 0
