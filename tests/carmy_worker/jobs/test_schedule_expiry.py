"""How long a schedule's state lives, against a real Redis: each fire keeps it its grace and
``CARMY_JOBS_RETENTION`` past the occurrence it waits for (a yearly one's past next year's), so a
schedule its workers fire keeps its counts, and the state of one no worker declares any more
goes by itself. Job loops without workers, as in test_driver.py."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import pytest
import redis
import redis.asyncio

from carmy_worker.jobs.driver import JobLoop
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import keys
from carmy_worker.wire import RetryPolicy, ScheduleSpec, ToolSpec, WorkerTool
from tests.cells import cells  # noqa: F401 (a fixture)
from tests.support import wait_until_async

pytestmark = pytest.mark.usefixtures("cells")

TICK = WorkerTool(spec=ToolSpec(name="tick", description="d", input_schema={"type": "object"}, output_schema={},
                                effect="write", idempotent=True, parallel_safe=True, confirmation="none"),
                  timeout=5.0, retry=RetryPolicy())
YEAR_MS = 365 * 86_400_000


def loop(ar: redis.asyncio.Redis, schedules: Sequence[ScheduleSpec], *, jobs_retention: int) -> JobLoop:
    return JobLoop(ar, tools=[TICK], group="g", settings=WorkerSettings(jobs_retention=jobs_retention),
                   schedules=schedules)


def redis_ms(sync_redis: redis.Redis) -> int:
    seconds, micros = sync_redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def until(sync_redis: redis.Redis, ms: int) -> None:
    """Until Redis's clock reads ``ms`` (an occurrence has come)."""
    await wait_until_async(lambda: redis_ms(sync_redis) >= ms, what=f"Redis's clock at {ms}")


def expires_at(sync_redis: redis.Redis, name: str) -> int:
    """When the schedule's state expires (Redis's ms): -1 if never, -2 if it is gone."""
    return int(sync_redis.execute_command("PEXPIRETIME", keys.schedule(name)))


def jobs_of(sync_redis: redis.Redis, name: str) -> int:
    """How many jobs the schedule ``name`` queued (they are never run here, so all are kept)."""
    every = [j.decode() for j in sync_redis.zrange(keys.jobs_all(keys.schedule_partition(name)), 0, -1)]
    return sum(1 for j in every if (sync_redis.hget(keys.job(j), "schedule") or b"").decode() == name)


@pytest.mark.slow
async def test_each_fire_keeps_the_state_past_the_occurrence_it_waits_for(ar: redis.asyncio.Redis,
                                                                          sync_redis: redis.Redis) -> None:
    # Kept 3 s (a grace of 1, a retention of 2) past each occurrence, fired every second: a
    # schedule its workers fire outlives its first expiry, its counts whole.
    one = loop(ar, [ScheduleSpec(name="kept", cron="* * * * * *", tool="tick", grace=1)], jobs_retention=2)
    await one.tick()
    waited = int(sync_redis.hget(keys.schedule("kept"), "next"))
    first_expiry = expires_at(sync_redis, "kept")
    assert first_expiry >= waited + 3000
    while redis_ms(sync_redis) < first_expiry + 1000:
        await until(sync_redis, waited)
        await one.tick()
        state = sync_redis.hgetall(keys.schedule("kept"))
        assert int(state[b"next"]) > waited  # it fired (or skipped, if this pass came late)
        waited = int(state[b"next"])
        assert expires_at(sync_redis, "kept") >= waited + 3000  # past the next occurrence, not before
    fired = int(state[b"fired"])
    assert fired >= 2 and fired == jobs_of(sync_redis, "kept")  # never started over


async def test_a_yearly_schedule_is_kept_past_next_years_occurrence(ar: redis.asyncio.Redis,
                                                                    sync_redis: redis.Redis) -> None:
    # Once a year, at the minute that has just passed (UTC): it waits for next year's, then that
    # occurrence is made the one it waits for, as if it had just come, and it fires.
    now = redis_ms(sync_redis)
    at = datetime.datetime.fromtimestamp(now // 60_000 * 60, datetime.UTC) - datetime.timedelta(minutes=1)
    yearly = ScheduleSpec(name="anniversary", cron=f"{at.minute} {at.hour} {at.day} {at.month} *", tool="tick",
                          grace=3600)
    one = loop(ar, [yearly], jobs_retention=60)
    await one.tick()
    assert int(sync_redis.hget(keys.schedule("anniversary"), "next")) - now > YEAR_MS - 120_000
    this_year = int(at.timestamp() * 1000)
    sync_redis.hset(keys.schedule("anniversary"), "next", this_year)
    one._schedules[0].next_ms = this_year
    await one.tick()
    state = sync_redis.hgetall(keys.schedule("anniversary"))
    assert int(state[b"fired"]) == 1 and int(state[b"last_at"]) == this_year
    assert int(state[b"next"]) >= this_year + YEAR_MS
    assert expires_at(sync_redis, "anniversary") == int(state[b"next"]) + 3_600_000 + 60_000
    assert sync_redis.pttl(keys.schedule("anniversary")) > YEAR_MS


@pytest.mark.slow
async def test_the_state_of_a_schedule_no_worker_declares_any_more_goes(ar: redis.asyncio.Redis,
                                                                        sync_redis: redis.Redis) -> None:
    # A deploy removed "retired" and kept "kept": the new workers declare only "kept".
    every_second = {"cron": "* * * * * *", "tool": "tick", "grace": 1.0}
    retired, kept = ScheduleSpec(name="retired", **every_second), ScheduleSpec(name="kept", **every_second)
    old = loop(ar, [retired, kept], jobs_retention=2)
    await old.tick()
    await until(sync_redis, int(sync_redis.hget(keys.schedule("retired"), "next")))
    await old.tick()
    assert int(sync_redis.hget(keys.schedule("retired"), "fired")) >= 1
    gone_by = expires_at(sync_redis, "retired")
    assert gone_by >= int(sync_redis.hget(keys.schedule("retired"), "next")) + 3000
    new = loop(ar, [kept], jobs_retention=2)
    while redis_ms(sync_redis) < gone_by + 1000:
        await new.tick()
        await until(sync_redis, new._schedules[0].next_ms or 0)
    await new.tick()
    assert not sync_redis.exists(keys.schedule("retired"))
    fired = int(sync_redis.hget(keys.schedule("kept"), "fired"))
    assert fired >= 2 and fired == jobs_of(sync_redis, "kept")


async def test_a_state_past_its_time_is_kept_from_the_workers_return(ar: redis.asyncio.Redis,
                                                                     sync_redis: redis.Redis) -> None:
    # A state written with no expiry (by workers of before), or under a longer CARMY_JOBS_RETENTION,
    # waits for an occurrence an hour gone: every worker was down. The first worker back keeps it
    # from now, and counts on what it had.
    spec = ScheduleSpec(name="back", cron="* * * * * *", tool="tick", grace=1)
    one = loop(ar, [spec], jobs_retention=60)
    await one.tick()
    key = keys.schedule("back")
    hour_ago = int(sync_redis.hget(key, "next")) - 3_600_000
    sync_redis.hset(key, mapping={"next": hour_ago, "fired": 5})
    sync_redis.persist(key)
    again = loop(ar, [spec], jobs_retention=60)
    await again.tick()
    state = sync_redis.hgetall(key)
    assert int(state[b"fired"]) >= 5 and int(state[b"skipped"]) >= 3500
    assert expires_at(sync_redis, "back") >= int(state[b"next"]) + 61_000
