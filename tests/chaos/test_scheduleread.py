"""The end's reading of missed occurrences (``chaos.scheduleread``) against a real Redis and a real
job loop: an occurrence fired and promoted is found down to its execution, and one never fired
is said to have no job."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio

from carmy_worker.jobs.driver import JobLoop
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import keys
from carmy_worker.wire import RetryPolicy, ScheduleSpec, ToolSpec, WorkerTool
from chaos.facts import Facts
from chaos.jobcheck import JobTable
from chaos.scheduleread import (
    ExecutionSeen,
    OccurrenceSeen,
    ScheduleSeen,
    excused_at_kill,
    read_missed,
    summary,
    uncertain_at_a_kill,
)
from tests.support import RedisServer

SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}
TICK = WorkerTool(spec=ToolSpec(name="tick", description="d", input_schema=SCHEMA, output_schema={}, effect="write",
                                idempotent=False, parallel_safe=True, confirmation="none"),
                  timeout=5.0, retry=RetryPolicy(max_attempts=3))


@pytest.fixture
async def ar(sync_redis: redis.Redis, redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    sync_redis.flushall()
    client = redis.asyncio.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


async def test_a_fired_occurrence_is_traced_to_its_execution_and_an_unfired_one_has_no_job(
        ar: redis.asyncio.Redis, sync_redis: redis.Redis) -> None:
    # Every hour, not every second: the pass below fires every occurrence due by then, so a test
    # that crossed an occurrence between its two passes would see a third fired (with a schedule
    # of every second it did, in CI, once). An hour's boundary falls in those milliseconds
    # almost never; the grace covers the two hours stepped back.
    hour = 3_600_000
    loop = JobLoop(ar, tools=[TICK], group="g", settings=WorkerSettings(),
                   schedules=[ScheduleSpec(name="s", cron="0 0 * * * *", tool="tick", grace=3 * hour / 1000)])
    await loop.tick()  # the schedule now waits for its next occurrence
    waited = int(await ar.hget(keys.schedule("s"), "next"))
    # As if the loops had been away two hours: the next pass fires those two occurrences.
    await ar.hset(keys.schedule("s"), "next", waited - 2 * hour)
    loop._schedules[0].next_ms = waited - 2 * hour
    await loop.tick()  # fired
    await loop.tick()  # promoted: no worker runs them

    seen = read_missed(sync_redis, "s", [waited - 2 * hour, waited + hour])

    assert seen.state["fired"] == "2"
    fired, never = seen.occurrences
    assert fired.job is not None and fired.job["status"] == "running"
    assert fired.rid == f"schedule:s@{fired.at}" and "payload" not in fired.job
    (execution,) = fired.executions
    assert execution.fields is not None and execution.fields["state"] == "queued"
    assert execution.record_status is None
    assert summary(fired) == (f"{fired.at}: job {fired.job_id} running after 1 attempt(s); "
                              f"{execution.xid}: state queued, attempt 0; no record")
    assert never.job_id is None and never.executions == []
    assert "no job" in summary(never)


async def test_an_occurrence_leased_and_never_promoted_says_so(ar: redis.asyncio.Redis,
                                                               sync_redis: redis.Redis) -> None:
    """The CI run that missed an occurrence said only "never promoted"; now the trail tells a
    LOOK's lease (its due score pushed past its due) from a job that left its due set."""
    loop = JobLoop(ar, tools=[TICK], group="g", settings=WorkerSettings(),
                   schedules=[ScheduleSpec(name="s", cron="* * * * * *", tool="tick", grace=30)])
    await loop.tick()
    waited = int(await ar.hget(keys.schedule("s"), "next"))
    await ar.hset(keys.schedule("s"), "next", waited - 1000)
    loop._schedules[0].next_ms = waited - 1000
    await loop.tick()  # fired, not yet looked at
    # Leased by another loop, then nothing.
    await loop._promotions.look(["tick"], "g", keys.schedule_partition("s"), room=10, loop_id="gone", number=1)

    (leased,) = read_missed(sync_redis, "s", [waited - 1000]).occurrences
    assert leased.job is not None and not leased.executions and leased.due_score is not None
    assert "never promoted; in its tool's due set" in summary(leased) and "(a LOOK's lease)" in summary(leased)
    sync_redis.zrem(keys.job_due("tick", keys.partition_of(leased.job_id or "")), leased.job_id or "")
    (gone,) = read_missed(sync_redis, "s", [waited - 1000]).occurrences
    assert summary(gone).endswith("never promoted; not in its tool's due set")


# -- an occurrence its worker's kill -9 left uncertain ---------------------------------------------

def begun_then_killed(*, status: str = "dead_lettered", began: bool = True, error: str = "EXECUTION_UNCERTAIN",
                      worker: str = "vm-host-4242-a1b2c3") -> OccurrenceSeen:
    """As the end read the CI run's one missed second: the job dead-lettered after its attempt
    began on a worker killed before the tool's first line, the execution settled uncertain."""
    fields = {"state": "done", "attempt": "2", "worker": worker} | ({"began": "1"} if began else {})
    return OccurrenceSeen(at="2026-12-03T22:55:54.000Z", rid="schedule:chaos-tick@2026-12-03T22:55:54.000Z",
                          job_id="job_x", job={"status": status, "attempts": "1"},
                          executions=[ExecutionSeen(xid="exec_x", fields=fields, record_status="failed",
                                                    record_error=error)])


def test_an_occurrence_begun_then_killed_is_uncertain_not_missed() -> None:
    at = datetime.datetime.fromisoformat("2026-12-03T22:55:54+00:00").timestamp()
    killed = {4242: at + 0.3}
    assert uncertain_at_a_kill(begun_then_killed(), killed, at)
    # Anything else is still a missed second: another end, never begun, another error, a worker
    # not killed, or killed before the occurrence.
    assert not uncertain_at_a_kill(begun_then_killed(status="succeeded"), killed, at)
    assert not uncertain_at_a_kill(begun_then_killed(began=False), killed, at)
    assert not uncertain_at_a_kill(begun_then_killed(error="TOOL_ERROR"), killed, at)
    assert not uncertain_at_a_kill(begun_then_killed(worker="vm-host-999-a1b2c3"), killed, at)
    assert not uncertain_at_a_kill(begun_then_killed(), {4242: at - 5}, at)


def test_the_run_counts_such_occurrences_apart_from_the_missed() -> None:
    missed = ["2026-12-03T22:55:54+00:00", "2026-12-03T22:55:55+00:00"]
    table = JobTable(jobs=0, delayed=0, planned_failures=0, unanswered=0, statuses={}, uncertain_dead=0,
                     interrupted=0, attempts=0, idempotent_reruns=0, lateness=[], lost=[], run_twice=[], early=[],
                     rerun_uncertain=[], unlike_runs=[], flipped=[], occurrences=0, fired_twice=[],
                     missed=list(missed), excused=0)
    never = OccurrenceSeen(at="2026-12-03T22:55:55.000Z", rid="r", job_id=None, job=None, executions=[])
    facts = Facts([], [])
    facts.killed = {4242: datetime.datetime.fromisoformat(missed[0]).timestamp() + 0.3}
    excused_at_kill(table, ScheduleSeen(state={}, occurrences=[begun_then_killed(), never]), facts)
    assert table.missed == missed[1:] and table.uncertain_at_kill == 1
    assert table.violations() == {"occurrences missed": 1}
