"""Redis at its maxmemory (``noeviction``): new work is refused, with nothing written, and the
work already accepted carries on to its record; the reading admission goes by. Against a
redis-server of this module's own, whose maxmemory the tests set."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio

import api
import carmy_worker
from carmy_worker.store import jobs, keys, records
from carmy_worker.store.attempts import MAX_ATTEMPTS, Attempts
from carmy_worker.store.follow import Join
from carmy_worker.store.janitor import Janitor
from carmy_worker.store.leases import Leases
from carmy_worker.store.lua import ACCEPTED_WORK, NEW_WORK, READS_ONLY
from carmy_worker.store.memory import MemoryReading, StoreMemory
from carmy_worker.store.progress import Progress
from carmy_worker.store.roster import Claims, Holding, Liveness
from carmy_worker.store.scripts import SCRIPTS
from carmy_worker.store.submit import Submission, Submit
from carmy_worker.store.verdicts import Verdicts
from carmy_worker.wire import ExecutionJob
from tests.carmy_worker.store.test_scripts import request_id_in
from tests.support import RedisServer, wait_until_async

RETENTION = 600
GROUP = "g1"
PARTITION = keys.partition_count() - 1  # the executions' (as in test_scripts)
QUEUE = jobs.queue_name(GROUP, PARTITION)
RID, OTHER_RID = request_id_in(PARTITION), request_id_in(PARTITION, "other")
MINUTE_MS = 60_000


@pytest.fixture
async def ar(own_redis: redis.Redis, own_redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(own_redis_server.url)
    yield client
    await client.aclose()


@contextlib.contextmanager
def full(r: redis.Redis) -> Iterator[None]:
    """Redis over its maxmemory: any write that may grow memory is refused."""
    info = r.info("memory")
    r.config_set("maxmemory", int(info["used_memory"]) // 2)  # type: ignore[index]  # sync client
    try:
        yield
    finally:
        r.config_set("maxmemory", 0)


def snapshot(r: redis.Redis) -> dict[bytes, bytes | None]:
    return {k: r.dump(k) for k in sorted(r.keys("*"))}


async def submit(ar: redis.asyncio.Redis, *, request_id: str | None = None, memory: StoreMemory | None = None,
                 tool: str = "noop") -> Submission:
    job = ExecutionJob(execution_id=keys.new_execution_id(PARTITION), tool=tool, arguments=b"{}", request_id=request_id,
                       principal="alice")
    return await Submit(ar, retention=RETENTION, memory=memory)(
        job, group=GROUP, idempotent=True, workers_alive=True, max_pending=10, queue_wait_ms=MINUTE_MS,
        admission_ms=MINUTE_MS)


def registered_scripts() -> dict[str, str]:
    """Every script of Carmy (``store.scripts.SCRIPTS``, once every module is imported), by name."""
    for package in (carmy_worker, api):
        for path in sorted(Path(package.__path__[0]).rglob("*.py")):
            module = ".".join(path.relative_to(Path(package.__path__[0]).parent).with_suffix("").parts)
            if not module.endswith("__main__"):
                importlib.import_module(module.removesuffix(".__init__"))
    return {name: script.source for name, script in SCRIPTS.items() if not name.startswith("TEST_")}


def test_every_script_says_whether_a_full_redis_may_run_it() -> None:
    scripts = registered_scripts()
    assert {"SETTLE", "LEASE", "REMEMBER"} <= set(scripts)  # every module's are listed
    new_work = {name for name, source in scripts.items() if source.startswith(NEW_WORK)}
    accepted = {name for name, source in scripts.items() if source.startswith(ACCEPTED_WORK)}
    reads = {name for name, source in scripts.items() if source.startswith(READS_ONLY)}
    # Only SUBMIT and the creation of jobs (by a caller, or a schedule's occurrence) take new work
    # in; the API's recheck only reads; everything else carries accepted work on, even over the
    # limit (a due job's promotion too).
    assert new_work == {"SUBMIT", "CREATE_JOB", "SCHEDULE_FIRE"}
    assert reads == {"STATES"}
    assert accepted == set(scripts) - new_work - reads


async def test_at_its_limit_redis_refuses_submit_whole_and_nothing_is_written(
        own_redis: redis.Redis, ar: redis.asyncio.Redis) -> None:
    memory = StoreMemory(ar, headroom=0.1)
    before = snapshot(own_redis)
    with full(own_redis):
        # Its first write prunes the admission set (a delete, allowed at the limit): without its
        # flags, SUBMIT went on to write the execution past it.
        assert await submit(ar, memory=memory) == Submission("store_full")
        assert await submit(ar, request_id=RID, memory=memory) == Submission("store_full")
    assert snapshot(own_redis) == before
    assert memory.refusals == 2 and not memory.room  # until the next reading
    assert (await memory.read()).full is False
    assert memory.room


async def test_without_room_new_calls_are_refused_and_retries_still_answered(
        own_redis: redis.Redis, ar: redis.asyncio.Redis) -> None:
    accepted = await submit(ar, request_id=RID)
    assert accepted.kind == "new"
    memory = StoreMemory(ar, headroom=0.1)
    memory.reading = MemoryReading(used=95, limit=100, admit_below=90)
    before = snapshot(own_redis)
    assert await submit(ar, request_id=OTHER_RID, memory=memory) == Submission("store_full")
    assert snapshot(own_redis) == before
    # A retry of the call accepted before is still answered: it joins, and later replays.
    assert await submit(ar, request_id=RID, memory=memory) == Submission("join", accepted.execution_id)
    verdict = await Attempts(ar, worker_id="w1", retention=RETENTION).claim(accepted.execution_id,
                                                                           max_attempts=MAX_ATTEMPTS)
    record = records.completed(accepted.execution_id, "noop", b"{}", cacheable=True, duration_ms=1)
    await Attempts(ar, worker_id="w1", retention=RETENTION).settle(record, exec_id=accepted.execution_id,
                                                                  attempt=verdict.attempt)
    assert (await submit(ar, request_id=RID, memory=memory)).kind == "replay"
    assert memory.refusals == 1


async def test_accepted_work_carries_on_to_its_record_over_the_limit(
        own_redis: redis.Redis, ar: redis.asyncio.Redis) -> None:
    submitted = {(await submit(ar)).execution_id for _ in range(3)}
    attempts = Attempts(ar, worker_id="w1", retention=RETENTION, group=GROUP)
    liveness = Liveness(ar, dead_after=3)
    await liveness.heartbeat("w1")
    with full(own_redis):
        leases = {lease.job_id: lease for lease in
                  await Leases(ar, "w1").take(QUEUE, most=2, lease_ms=MINUTE_MS, look_ahead=10)}
        # Two of them (submitted in the same millisecond, they are leased in the order of their ids).
        ran, waits = sorted(leases)
        [goes] = submitted - set(leases)
        assert leases[ran].claim is not None and leases[ran].claim.verdict == "run"
        beat = await liveness.heartbeat("w1", claims=Claims(held=[Holding(ran, 1), Holding(waits, 1)],
                                                            jobs=list(leases)))
        assert beat.lost == []
        assert await Progress(ar, worker_id="w1")(ran, 1, b"event", "half way")
        assert (await Join(ar)(ran, "noop", channel="carmy:api:other", stream=False)).state == "running"
        assert await Verdicts(ar, retention=RETENTION).cancel(goes, "noop") == "cancelled"
        await Janitor(ar, retention=RETENTION, dead_after=3).sweep()
        await liveness.register("w2", b"a worker starting now")  # one more worker to serve them
        await liveness.drain("w1")
        record = records.completed(ran, "noop", b'{"big":"' + b"x" * 65536 + b'"}', cacheable=True, duration_ms=1)
        assert await attempts.settle(record, exec_id=ran, attempt=1, lease=leases[ran].token)
    assert own_redis.hget(keys.execution(ran), "state") == b"done"
    assert own_redis.exists(keys.record(ran)) and own_redis.exists(keys.record(goes))
    assert not own_redis.exists(jobs.job_key(ran))  # its lease ended with it
    assert own_redis.get(keys.worker("w2")) == b"a worker starting now"
    assert own_redis.smembers(keys.draining(0)) == {b"w1"}


def test_a_reading_refuses_from_the_limit_less_the_headroom() -> None:
    info = {"used_memory": 950, "mem_not_counted_for_evict": 60, "maxmemory": 1000}
    reading = MemoryReading.of(info, 0.1)
    assert (reading.used, reading.limit, reading.admit_below, reading.full) == (890, 1000, 900, False)
    assert MemoryReading.of({**info, "mem_not_counted_for_evict": 50}, 0.1).full
    assert not MemoryReading.of({**info, "mem_not_counted_for_evict": 0}, 0.0).full
    assert not MemoryReading.of({**info, "maxmemory": 0}, 0.1).full  # no limit, nothing refused


async def test_a_reading_follows_redis(own_redis: redis.Redis, ar: redis.asyncio.Redis) -> None:
    memory = StoreMemory(ar, headroom=0.5)
    used = (await memory.read()).used
    own_redis.config_set("maxmemory", used + used // 2)  # two thirds of it taken, over the half
    assert (await memory.read()).full and not memory.room
    own_redis.config_set("maxmemory", used * 4)
    assert not (await memory.read()).full and memory.room


async def test_a_redis_that_refuses_info_leaves_admission_to_its_own_limit(
        own_redis: redis.Redis, own_redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """An ACL without INFO: no reading, a warning once, and new calls refused only by Redis
    itself at its maxmemory (``/ready`` then leaves the memory check out: tests/api)."""
    own_redis.acl_setuser("no-info", enabled=True, passwords=["+secret"], keys=["*"], channels=["*"],
                          commands=["+@all", "-info"])
    client = redis.asyncio.Redis.from_url(f"redis://no-info:secret@127.0.0.1:{own_redis_server.port}/0")
    memory = StoreMemory(client, headroom=0.1)
    reads = 0
    read = memory.read

    async def counted() -> MemoryReading:
        nonlocal reads
        reads += 1
        return await read()

    memory.read = counted  # type: ignore[method-assign]
    reading = asyncio.create_task(memory.run(interval=0.01))
    try:
        await wait_until_async(lambda: reads >= 3, what="three readings tried")
    finally:
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
    assert caplog.text.count("Redis refuses INFO") == 1
    assert memory.reading is None and memory.room
    assert (await submit(client, memory=memory)).kind == "new"
    with full(own_redis):
        assert await submit(client, memory=memory) == Submission("store_full")
    own_redis.acl_deluser("no-info")
    await client.aclose()
