"""The roster as cells (docs/architecture.md, section 3), over four partitions: a worker beats,
drains and departs in every partition; each partition's janitor judges the workers by its own
roster and reaps its own executions; a beat checks what the worker holds in each partition.

The executions are accepted by SUBMIT, each in the partition its id was drawn for, and claimed
as LEASE's claim leaves one (its hash running the attempt on the worker, in the worker's running
set of the execution's partition): what a worker killed mid-run leaves behind.
"""

from __future__ import annotations

import collections
import os
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio

from carmy_worker.store import jobs, keys, roster
from carmy_worker.store.janitor import Janitor
from carmy_worker.store.roster import Claims, Holding, Liveness, Orphan, Stray, SyncLiveness, lock_holder
from carmy_worker.store.submit import Submit
from carmy_worker.wire import ExecutionJob, record_decoder
from tests.cells import partitions
from tests.support import RedisServer

PARTITIONS = 4
RETENTION = 600
DEAD_AFTER = 3.0
GROUP = "g-cells"
MINUTE_MS = 60_000


@pytest.fixture
def cells() -> Iterator[None]:
    """Every key named over four partitions for the test (whatever the run's count is)."""
    if os.environ.get("CARMY_SLOT_PARTITIONS") == "1":
        # tests/slotrecorder.py keeps these calls to replay them as one partition's on a cluster
        # (tests/cluster/test_scripts_on_cluster.py): calls made over four are not.
        pytest.skip("the calls of one partition are being recorded")
    with partitions(PARTITIONS):
        yield


@pytest.fixture
def r(sync_redis: redis.Redis, cells: None) -> redis.Redis:
    sync_redis.flushall()
    return sync_redis


@pytest.fixture
async def ar(r: redis.Redis, redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


async def accepted(ar: redis.asyncio.Redis, partition: int, *, idempotent: bool) -> str:
    """A new execution of ``partition``, accepted and queued."""
    exec_id = keys.new_execution_id(partition)
    job = ExecutionJob(execution_id=exec_id, tool="tally", arguments=b"{}")
    await Submit(ar, retention=RETENTION)(job, group=GROUP, idempotent=idempotent, workers_alive=True, max_pending=100,
                                          queue_wait_ms=MINUTE_MS, admission_ms=MINUTE_MS)
    return exec_id


def claimed(r: redis.Redis, exec_id: str, worker_id: str) -> Holding:
    """``exec_id``'s first attempt claimed by ``worker_id`` and its tool begun, as LEASE's claim
    and BEGIN leave it, in the execution's partition."""
    partition = keys.partition_of(exec_id)
    r.hset(keys.execution(exec_id), mapping={"state": "running", "attempt": 1, "worker": worker_id, "began": 1})
    r.sadd(keys.running(worker_id, partition), exec_id)
    r.zrem(keys.queued(partition), exec_id)
    return Holding(exec_id, 1)


def redis_now_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def watched_since_a_minute(r: redis.Redis) -> None:
    """Every partition watched without a gap for a minute: the roster gives no benefit of the
    doubt to a worker that was alive when observation began."""
    now = redis_now_ms(r)
    for partition in keys.partitions():
        r.hset(keys.watch(partition), mapping={"seen": now, "since": now - MINUTE_MS, "from": now - MINUTE_MS})


def state(r: redis.Redis, exec_id: str) -> str:
    return (r.hget(keys.execution(exec_id), "state") or b"").decode()


def error_code(r: redis.Redis, exec_id: str) -> str | None:
    raw = r.get(keys.record(exec_id))
    return None if raw is None else record_decoder.decode(raw).error_code


async def test_a_dead_workers_executions_are_reaped_in_every_partition(r: redis.Redis,
                                                                        ar: redis.asyncio.Redis) -> None:
    liveness = Liveness(ar, dead_after=DEAD_AFTER)
    retried, uncertain, kept = [], [], []
    for partition in keys.partitions():
        retried.append(claimed(r, await accepted(ar, partition, idempotent=True), "dead").execution_id)
        uncertain.append(claimed(r, await accepted(ar, partition, idempotent=False), "dead").execution_id)
        kept.append(claimed(r, await accepted(ar, partition, idempotent=False), "alive"))
    await liveness.heartbeat("dead", offset_ms=-10_000)  # killed ten seconds ago
    await liveness.heartbeat("alive", claims=Claims(held=kept))
    janitor = Janitor(ar, retention=RETENTION, dead_after=DEAD_AFTER)

    assert await janitor.sweep() == 2 * PARTITIONS
    for partition in keys.partitions():
        assert r.scard(keys.running("dead", partition)) == 0
        assert r.smembers(keys.running("alive", partition)) == {kept[partition].execution_id.encode()}
    # Idempotent: back in the queue, and the next claim is a new attempt. Not idempotent: ended.
    now_ms = redis_now_ms(r)
    for exec_id in retried:
        assert state(r, exec_id) == "queued" and error_code(r, exec_id) is None
        queue = r.hget(keys.execution(exec_id), "wake").decode().removesuffix(jobs.WAKE_SUFFIX)
        assert r.zscore(queue, exec_id) <= now_ms  # due again at once, for the next worker to take
    assert [error_code(r, exec_id) for exec_id in uncertain] == ["EXECUTION_UNCERTAIN"] * PARTITIONS
    assert all(state(r, h.execution_id) == "running" and error_code(r, h.execution_id) is None for h in kept)
    assert await janitor.sweep() == 0  # nothing is reaped twice


async def test_a_worker_is_dead_in_a_partition_only_by_that_partitions_roster(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    held = [claimed(r, await accepted(ar, partition, idempotent=False), "cut-off") for partition in keys.partitions()]
    await Liveness(ar, dead_after=DEAD_AFTER).heartbeat("cut-off", claims=Claims(held=held))
    # Its beats stopped reaching partition 2's slot ten seconds ago (a primary it cannot reach).
    r.zadd(keys.workers(2), {"cut-off": redis_now_ms(r) - 10_000})

    assert await Janitor(ar, retention=RETENTION, dead_after=DEAD_AFTER).sweep() == 1
    assert [error_code(r, h.execution_id) for h in held] == [None, None, "EXECUTION_UNCERTAIN", None]


async def test_a_draining_worker_is_skipped_in_every_partition_and_departs_from_all(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    watched_since_a_minute(r)
    liveness = Liveness(ar, dead_after=DEAD_AFTER)
    for worker_id in ("leaving", "staying"):
        await liveness.heartbeat(worker_id)
    await liveness.drain("leaving")
    rosters = await liveness.rosters()
    assert len(rosters) == PARTITIONS
    assert all(roster.alive("leaving") and not roster.serving("leaving") for roster in rosters)
    assert all(roster.serving("staying") for roster in rosters)

    await liveness.depart("leaving")
    rosters = await liveness.rosters()
    assert not any(roster.alive("leaving") or "leaving" in roster.draining for roster in rosters)
    assert all(roster.serving("staying") for roster in rosters)


async def test_a_beat_checks_what_its_worker_holds_in_every_partition(r: redis.Redis,
                                                                       ar: redis.asyncio.Redis) -> None:
    liveness = Liveness(ar, dead_after=DEAD_AFTER)
    mine = [claimed(r, await accepted(ar, partition, idempotent=True), "w1") for partition in keys.partitions()]
    # Partition 3's was reaped while w1 was paused; partition 2 lists one w1 did not name (a claim
    # whose reply never came); partition 1's lock went to another attempt; partition 0 has a lease
    # w1 does not know of (a LEASE whose reply never came).
    r.hset(keys.execution(mine[3].execution_id), "reaped", 1)
    stray = claimed(r, await accepted(ar, 2, idempotent=True), "w1").execution_id
    lock = keys.lock("tally")
    r.set(lock, lock_holder("exec_someone_else", 1))
    held = [mine[0], Holding(mine[1].execution_id, 1, lock), mine[2], mine[3]]
    orphan = await accepted(ar, 0, idempotent=True)
    r.hset(keys.leases("w1", 0), orphan, "w1/lost/" + orphan)
    r.set(jobs.in_progress_key(orphan), "w1/lost/" + orphan)

    beat = await liveness.heartbeat("w1", claims=Claims(held=held))
    assert beat.lost == [mine[3].execution_id]
    assert beat.unlocked == [mine[1].execution_id]
    assert beat.strays == [Stray(stray, 1, "tally")]
    assert beat.orphans == [Orphan(orphan, "w1/lost/" + orphan)]
    assert beat.registered is False  # partition 0's beat looks for the info: none was written
    # Passed back on the next beat, the orphaned lease is released in its own partition.
    await liveness.heartbeat("w1", claims=Claims(held=held, release=beat.orphans))
    assert not r.hexists(keys.leases("w1", 0), orphan) and not r.exists(jobs.in_progress_key(orphan))
    await liveness.register("w1", b"info")
    assert (await liveness.heartbeat("w1", claims=Claims(held=held))).registered is True


async def test_every_partition_forgets_a_long_departed_worker_and_partition_0_its_info(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    liveness = Liveness(ar, dead_after=DEAD_AFTER)
    await liveness.register("gone", b"info")
    await liveness.drain("gone")
    await liveness.heartbeat("gone", offset_ms=-(3600 * 1000 + 1000))
    await Janitor(ar, retention=RETENTION, dead_after=DEAD_AFTER).sweep()
    assert not r.exists(keys.worker("gone"))
    for partition in keys.partitions():
        assert r.zscore(keys.workers(partition), "gone") is None
        assert not r.sismember(keys.draining(partition), "gone")


async def test_a_janitor_settles_the_late_executions_of_every_partition(r: redis.Redis,
                                                                         ar: redis.asyncio.Redis) -> None:
    late = []
    for partition in keys.partitions():
        exec_id = await accepted(ar, partition, idempotent=True)
        r.zadd(keys.queued(partition), {exec_id: 0})  # its start-by long past
        r.hset(keys.execution(exec_id), "start_by", 0)
        late.append(exec_id)
    assert await Janitor(ar, retention=RETENTION, dead_after=DEAD_AFTER).sweep() == PARTITIONS
    assert [error_code(r, exec_id) for exec_id in late] == ["TIMEOUT"] * PARTITIONS


def test_a_beat_sends_one_heartbeat_per_partition_in_one_pipeline(r: redis.Redis) -> None:
    """The heartbeat thread's client: a beat is one HEARTBEAT in each partition, nothing more."""
    liveness = SyncLiveness(r, dead_after=DEAD_AFTER)
    liveness.heartbeat("w1")  # the script loaded
    r.config_resetstat()
    beat = liveness.heartbeat("w1")
    assert beat.lost == [] and beat.strays == [] and beat.registered is False
    assert all(r.zscore(keys.workers(p), "w1") is not None for p in keys.partitions())
    stats = r.info("commandstats")  # the commands sent, and those the scripts ran
    assert stats["cmdstat_evalsha"]["calls"] == stats["cmdstat_zadd"]["calls"] == PARTITIONS


async def test_a_worker_holding_more_than_a_slice_beats_in_parts_with_the_same_findings(
        r: redis.Redis, ar: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker holding more than BEAT_SLICE executions in a partition beats there in parts
    (no one script holds Redis for the whole of them), and finds what one script would: the
    executions it lost, the strays and the orphaned leases; the beat's own sets are gone after."""
    monkeypatch.setattr(roster, "BEAT_SLICE", 2)
    big = 1  # the partition where the worker holds five executions and has five jobs; one each elsewhere
    held = [claimed(r, await accepted(ar, big, idempotent=True), "w1") for _ in range(5)]
    held += [claimed(r, await accepted(ar, p, idempotent=True), "w1") for p in keys.partitions() if p != big]
    lost, stray = held[3].execution_id, claimed(r, await accepted(ar, big, idempotent=True), "w1").execution_id
    r.hset(keys.execution(lost), "worker", "w2")  # given to another worker while w1 was away
    jobs_had, orphan = [h.execution_id for h in held[:5]], keys.new_execution_id(big)
    for job in [*jobs_had, orphan]:
        r.hset(keys.leases("w1", big), job, f"token-{job}")
    liveness = Liveness(ar, dead_after=DEAD_AFTER)
    await liveness.heartbeat("w1")  # the script loaded
    r.config_resetstat()
    beat = await liveness.heartbeat("w1", claims=Claims(held=held, jobs=jobs_had))
    assert beat.lost == [lost]
    assert beat.strays == [Stray(stray, 1, "tally")]
    assert beat.orphans == [Orphan(orphan, f"token-{orphan}")]
    # Five held and five jobs in slices of two: three parts, a scan step of the running set and
    # one of the leases, and the last; one script elsewhere.
    assert r.info("commandstats")["cmdstat_evalsha"]["calls"] == 6 + (PARTITIONS - 1)
    assert not r.exists(keys.beat_named("w1", big), keys.beat_has("w1", big), keys.beat_scan("w1", big))
    assert all(r.zscore(keys.workers(p), "w1") is not None for p in keys.partitions())
    # The orphan passed back is released by the next beat's last part, the jobs it has are not.
    await liveness.heartbeat("w1", claims=Claims(held=held, jobs=jobs_had, release=beat.orphans))
    assert sorted(k.decode() for k in r.hkeys(keys.leases("w1", big))) == sorted(jobs_had)


async def test_a_beat_in_parts_scans_in_steps_and_its_last_part_takes_the_steps_left(
        r: redis.Redis, ar: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """The strays and orphans of a beat in parts are found a step at a time (no one script reads
    the whole running set or leases), as many steps as the worker's own count says; a running
    set and leases grown past that count (strays and orphans by the score) are scanned to their
    end by the last part. Each is reported once, and the scan's cursors are gone after."""
    monkeypatch.setattr(roster, "BEAT_SLICE", 2)
    monkeypatch.setattr(roster, "SCAN_SLICE", 3)
    big = 2
    held = [claimed(r, await accepted(ar, big, idempotent=True), "w1") for _ in range(4)]
    strays = {claimed(r, keys.new_execution_id(big), "w1").execution_id for _ in range(90)}
    for stray in strays:  # as SUBMIT left them (more than its admission takes in a test)
        r.hset(keys.execution(stray), "tool", "tally")
    jobs_had = [h.execution_id for h in held]
    orphans = {keys.new_execution_id(big) for _ in range(600)}  # past a listpack hash's 512: scanned in steps
    r.hset(keys.leases("w1", big), mapping={job: f"token-{job}" for job in [*jobs_had, *orphans]})
    liveness = Liveness(ar, dead_after=DEAD_AFTER)
    await liveness.heartbeat("w1")  # the script loaded
    r.config_set("slowlog-max-len", 10_000)
    r.config_set("slowlog-log-slower-than", 0)  # every command, those the scripts run too
    r.slowlog_reset()
    beat = await liveness.heartbeat("w1", claims=Claims(held=held, jobs=jobs_had))
    scans = [e for e in r.slowlog_get(10_000) if e["command"].split()[0] in (b"SSCAN", b"HSCAN")]
    r.config_set("slowlog-log-slower-than", 10_000)
    r.config_set("slowlog-max-len", 128)
    assert beat.lost == []
    assert sorted(s.execution_id for s in beat.strays) == sorted(strays)
    assert {s.attempt for s in beat.strays} == {1} and {s.tool for s in beat.strays} == {"tally"}
    assert sorted(o.job_id for o in beat.orphans) == sorted(orphans)
    assert all(o.token == f"token-{o.job_id}" for o in beat.orphans)
    # Four held and four jobs: two scan parts, each a step of three or so, then the last part's
    # steps, to the end of 94 members and 604 leases.
    steps = collections.Counter(e["command"].split()[0] for e in scans)
    assert steps[b"SSCAN"] > 94 // 6 and steps[b"HSCAN"] > 604 // 6
    assert not r.exists(keys.beat_named("w1", big), keys.beat_has("w1", big), keys.beat_scan("w1", big))
    # The orphans passed back are released by the next beat's first scan part.
    beat = await liveness.heartbeat("w1", claims=Claims(held=[*held, *(Holding(e, 1) for e in strays)],
                                                         jobs=jobs_had, release=beat.orphans))
    assert beat.strays == [] and beat.orphans == []
    assert sorted(k.decode() for k in r.hkeys(keys.leases("w1", big))) == sorted(jobs_had)


def test_a_beat_in_parts_sends_each_part_in_a_round_trip_of_its_own(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis runs the commands one read of a client brings back to back: a beat's parts sent in
    one pipeline held every other client as long as one script over them all. Each pipeline of
    a beat in parts carries at most one call per partition, in each partition's order (named
    parts, scan steps, last), and the next goes out once it has answered."""
    monkeypatch.setattr(roster, "BEAT_SLICE", 2)
    held = [Holding(keys.new_execution_id(p), 1) for p in keys.partitions() for _ in range(5)]
    sent: list[list[str]] = []  # each pipeline's parts
    real = roster.run_each_sync

    def counted(client: redis.Redis, script: object, calls: list[roster.Call], **kw: object) -> object:
        sent.append([f"{args[7]}@{call_keys[0]}" for call_keys, args in calls])
        return real(client, script, calls, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(roster, "run_each_sync", counted)
    SyncLiveness(r, dead_after=DEAD_AFTER).heartbeat("w1", claims=Claims(held=held))
    # Five held in each partition, by twos: three named parts, a scan step, the last part.
    assert len(sent) == 5
    for n, pipeline in enumerate(sent):
        assert len(pipeline) == PARTITIONS and len({p.split("@")[1] for p in pipeline}) == PARTITIONS
        assert {p.split("@")[0] for p in pipeline} == {["first", "more", "more", "scan", "last"][n]}


async def test_a_redis_that_lost_its_scripts_still_gets_every_beat_and_scan(r: redis.Redis,
                                                                            ar: redis.asyncio.Redis) -> None:
    """A restarted Redis, or a new primary (NOSCRIPT): each partition's call is loaded and run again."""
    liveness = Liveness(ar, dead_after=DEAD_AFTER)
    await liveness.heartbeat("w1")
    held = [claimed(r, await accepted(ar, partition, idempotent=False), "dead") for partition in keys.partitions()]
    await liveness.heartbeat("dead", offset_ms=-10_000)
    r.script_flush()
    beat = SyncLiveness(r, dead_after=DEAD_AFTER).heartbeat("w1")
    assert beat.lost == [] and all(r.zscore(keys.workers(p), "w1") is not None for p in keys.partitions())
    r.script_flush()
    assert await Janitor(ar, retention=RETENTION, dead_after=DEAD_AFTER).sweep() == PARTITIONS
    assert [error_code(r, h.execution_id) for h in held] == ["EXECUTION_UNCERTAIN"] * PARTITIONS
    r.script_flush()
    assert all(roster.alive("w1") for roster in await liveness.rosters())
