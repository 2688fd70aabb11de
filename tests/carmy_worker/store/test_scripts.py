"""The Lua scripts, one branch at a time, against the real Redis.

Every state change of an execution goes through one of these scripts; a wrong branch here is a
call that runs twice, never ends, or answers twice. Each script is called through its typed
wrapper (``carmy_worker.store``), exactly as the API and the workers
call it; the blocking client ``r`` only observes what they left in Redis.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import pytest
import redis
import redis.asyncio
from redis.client import PubSub

from carmy_worker.runtime.lock import ToolLock
from carmy_worker.store import jobs, keys, metrics, records, roster
from carmy_worker.store.attempts import MAX_ATTEMPTS, STARTED, Attempts, Claim
from carmy_worker.store.durable import Durability
from carmy_worker.store.janitor import DEPARTED_MEMORY_S, Janitor
from carmy_worker.store.leases import Leases
from carmy_worker.store.locks import ToolLocks
from carmy_worker.store.progress import Progress
from carmy_worker.store.roster import Beat, Claims, Holding, Liveness, Orphan, Stray, SyncLiveness, lock_holder
from carmy_worker.store.submit import Submission, Submit
from carmy_worker.store.verdicts import Verdicts
from carmy_worker.wire import (
    MAX_EVENT_BYTES,
    ExecutionJob,
    Record,
    StartedData,
    completed_event,
    event_decoder,
    final_event,
    json_encoder,
    msgpack_encoder,
    record_decoder,
    started_event,
)
from tests.cells import cells  # noqa: F401 (a fixture)
from tests.support import RedisServer

RETENTION = 600
GROUP = "g1"
# The partition these tests' executions are drawn into: the last, so that with several (the
# slot recorder's, CARMY_REDIS_PARTITIONS) a script that names partition 0's keys for them fails.
PARTITION = keys.partition_count() - 1
QUEUE = jobs.queue_name(GROUP, PARTITION)
WAKE = jobs.wake_list(QUEUE)
MINUTE_MS = 60_000
PRINCIPAL = "alice"
REAPED_WHY = "its worker stopped responding"


@pytest.fixture
def r(sync_redis: redis.Redis) -> redis.Redis:
    sync_redis.flushall()
    return sync_redis


@pytest.fixture
async def ar(r: redis.Redis, redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """The asyncio client the wrappers run the scripts on (after ``r`` emptied Redis)."""
    client = redis.asyncio.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


def redis_now_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def new_id() -> str:
    return keys.new_execution_id(PARTITION)


def request_id_in(partition: int, name: str = "rid", principal: str = PRINCIPAL) -> str:
    """A request id (``name``, numbered) whose idempotency key is in ``partition``: SUBMIT keeps
    a call's idempotency record in its execution's partition (the API draws the id there)."""
    return next(f"{name}-{n}" for n in itertools.count()
                if keys.request_partition(principal, None, f"{name}-{n}") == partition)


RID = request_id_in(PARTITION)


def execution_job(exec_id: str, *, tool: str = "tally", arguments: bytes = b"{}",
                  request_id: str | None = None) -> ExecutionJob:
    return ExecutionJob(execution_id=exec_id, tool=tool, arguments=arguments, request_id=request_id,
                        principal=PRINCIPAL)


async def submit(
    ar: redis.asyncio.Redis, exec_id: str, *, request_id: str | None = None, arguments: bytes = b"{}",
    tool: str = "tally", idempotent: bool = False, workers_alive: bool = True, max_pending: int = 10,
    admission_ms: int = MINUTE_MS, queue_wait_ms: int = MINUTE_MS,
) -> Submission:
    job = execution_job(exec_id, tool=tool, arguments=arguments, request_id=request_id)
    # max_pending is the partition's share: SUBMIT admits ceil(M/N) in each.
    return await Submit(ar, retention=RETENTION)(
        job, group=GROUP, idempotent=idempotent, workers_alive=workers_alive,
        max_pending=max_pending * keys.partition_count(),
        queue_wait_ms=queue_wait_ms, admission_ms=admission_ms,
    )


async def claim(ar: redis.asyncio.Redis, exec_id: str, worker_id: str = "w1") -> tuple[str, int]:
    got = await Attempts(ar, worker_id=worker_id, retention=RETENTION).claim(exec_id, max_attempts=MAX_ATTEMPTS)
    return got.verdict, got.attempt


def done_record(exec_id: str, tool: str = "tally", n: int = 1) -> Record:
    return records.completed(exec_id, tool, b'{"n":%d}' % n, cacheable=False, duration_ms=42)


async def settle(ar: redis.asyncio.Redis, exec_id: str, attempt: int, record: Record, *, worker_id: str = "w1",
                 run_ms: int | None = 42, completed: bool = True, ran: bool = True) -> bool:
    done = completed_event(exec_id, record.tool, run_ms or 0, record.status == "completed") if completed else None
    return await Attempts(ar, worker_id=worker_id, retention=RETENTION).settle(
        record, exec_id=exec_id, attempt=attempt, completed_event=done, run_ms=run_ms, ran=ran,
    )


def stored(record: Record) -> bytes:
    """``record`` as the scripts store it (and as its ``final`` event carries it)."""
    return final_event(record)[0]


async def cancel(ar: redis.asyncio.Redis, exec_id: str, tool: str = "tally") -> tuple[str, bytes]:
    """The outcome, and the CANCELLED record a cancel of a queued execution writes."""
    outcome = await Verdicts(ar, retention=RETENTION).cancel(exec_id, tool)
    return outcome, stored(records.cancelled(exec_id, tool, started=False))


async def reap(ar: redis.asyncio.Redis, exec_id: str, worker_id: str, tool: str = "tally") -> tuple[str, bytes]:
    """The outcome, and the EXECUTION_UNCERTAIN record a reap of a non-idempotent execution writes."""
    outcome = await Verdicts(ar, retention=RETENTION).reap(exec_id, tool, worker_id=worker_id, why=REAPED_WHY)
    return outcome, stored(records.uncertain(exec_id, tool, REAPED_WHY))


async def expire(ar: redis.asyncio.Redis, exec_id: str, tool: str = "tally") -> tuple[bool, bytes]:
    """Whether it expired, and the TIMEOUT record it then writes."""
    outcome = await Verdicts(ar, retention=RETENTION).expire_unstarted(exec_id, tool)
    return outcome, stored(records.never_started(exec_id, tool))


@pytest.fixture(params=["whole", "in-parts"])
def beat_parts(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A heartbeat as one script per partition, or (``in-parts``) in parts of one execution and
    one job each then a last, as a worker holding more than ``roster.BEAT_SLICE`` sends it: the
    same beat."""
    if request.param == "in-parts":
        monkeypatch.setattr(roster, "BEAT_SLICE", 0)
    return str(request.param)


async def heartbeat(ar: redis.asyncio.Redis, worker_id: str, offset_ms: int = 0,
                    held: tuple[Holding, ...] = (), claims: Claims | None = None) -> Beat:
    claims = claims or Claims(held=list(held))
    return await Liveness(ar, dead_after=3.0).heartbeat(worker_id, offset_ms=offset_ms, claims=claims)


@pytest.fixture
def listen(r: redis.Redis) -> Iterator[Any]:
    """``listen(*channels)`` subscribes (confirmed) and returns the pubsub to read from: a
    partition's channels (``{c:N}`` in their name) sharded, as the scripts SPUBLISH to them."""
    opened: list[PubSub] = []

    def subscribe(*channels: str) -> PubSub:
        p = r.pubsub()
        opened.append(p)
        for channel in channels:
            sharded = "{c:" in channel
            p.ssubscribe(channel) if sharded else p.subscribe(channel)
            message = p.get_sharded_message(timeout=2) if sharded else p.get_message(timeout=2)
            assert message is not None and message["type"] == ("ssubscribe" if sharded else "subscribe")
        return p

    yield subscribe
    for p in opened:
        p.close()


def received(p: PubSub, wait: float = 0.2) -> list[tuple[str, bytes]]:
    """Every (channel, data) that arrives within ``wait`` seconds."""
    out = []
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        message = p.get_message(timeout=left)
        if message is not None and message["type"] in ("message", "smessage"):
            out.append((message["channel"].decode(), message["data"]))
    return out


def event_names(p: PubSub, wait: float = 0.2) -> list[str]:
    return [event_decoder.decode(data).name for _, data in received(p, wait)]


def state(r: redis.Redis, exec_id: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(keys.execution(exec_id)).items()}


def in_zset(r: redis.Redis, zset: str, member: str) -> bool:
    return r.zscore(zset, member) is not None


async def running(ar: redis.asyncio.Redis, *, idempotent: bool = False, request_id: str | None = None,
                  worker_id: str = "w1", partition: int = PARTITION) -> str:
    """A new execution of ``partition``, claimed by ``worker_id`` (attempt 1), its tool begun
    (BEGIN, as the runtime marks a non-idempotent one)."""
    exec_id = keys.new_execution_id(partition)
    await submit(ar, exec_id, idempotent=idempotent, request_id=request_id)
    assert await claim(ar, exec_id, worker_id) == ("run", 1)
    assert await Attempts(ar, worker_id=worker_id, retention=RETENTION).begin(exec_id, 1) is True
    return exec_id


# --- SUBMIT ----------------------------------------------------------------------------------


async def test_submit_new_writes_execution_job_admission_and_idempotency(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    exec_id = new_id()
    before, wall_before = redis_now_ms(r), int(time.time() * 1000)
    assert await submit(ar, exec_id, request_id=RID, admission_ms=90_000, queue_wait_ms=30_000) == Submission(
        "new", exec_id)
    after, wall_after = redis_now_ms(r), int(time.time() * 1000)

    h = state(r, exec_id)
    assert (h["state"], h["attempt"], h["tool"], h["owner"], h["idem"], h["wake"]) == (
        "queued", "0", "tally", keys.owner(PRINCIPAL), "0", WAKE)
    assert before + 30_000 <= int(h["start_by"]) <= after + 30_000
    assert RETENTION - 1 <= r.ttl(keys.execution(exec_id)) <= RETENTION
    assert before + 90_000 <= r.zscore(keys.pending(PARTITION), exec_id) <= after + 90_000
    assert r.zscore(keys.queued(PARTITION), exec_id) == int(h["start_by"])
    # The job is the ExecutionJob, in the arq layout, enqueued now.
    job = r.get(jobs.job_key(exec_id))
    enqueued_ms = msgspec.msgpack.decode(job)["et"]
    assert wall_before <= enqueued_ms <= wall_after
    assert job == jobs.encode_job(msgpack_encoder.encode(execution_job(exec_id, request_id=RID)), enqueued_ms)
    assert RETENTION - 1 <= r.ttl(jobs.job_key(exec_id)) <= RETENTION
    assert in_zset(r, QUEUE, exec_id)
    idem = keys.idempotency(PRINCIPAL, None, RID)
    assert r.get(idem) == f"{exec_id} {keys.fingerprint('tally', b'{}')}".encode()
    assert RETENTION - 1 <= r.ttl(idem) <= RETENTION
    assert r.llen(WAKE) == 1  # one token: one idle worker looks at the queue at once


async def test_submit_same_request_while_running_joins_the_original(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    first = new_id()
    await submit(ar, first, request_id=RID)
    second = new_id()
    assert await submit(ar, second, request_id=RID) == Submission("join", first)
    assert not r.exists(keys.execution(second), jobs.job_key(second))
    assert r.zcard(keys.pending(PARTITION)) == 1 and r.zcard(QUEUE) == 1


async def test_submit_same_request_after_the_record_replays_it(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    first = await running(ar, request_id=RID)
    assert await settle(ar, first, 1, done_record(first)) is True
    record = record_decoder.decode(r.get(keys.record(first)))
    second = new_id()
    assert await submit(ar, second, request_id=RID) == Submission("replay", first, record)
    assert not r.exists(keys.execution(second), jobs.job_key(second))


async def test_submit_same_request_with_other_arguments_conflicts(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    first = new_id()
    await submit(ar, first, request_id=RID, arguments=b'{"n":1}')
    second = new_id()
    assert await submit(ar, second, request_id=RID, arguments=b'{"n":2}') == Submission("conflict", first)
    assert not r.exists(keys.execution(second), jobs.job_key(second))
    # Still a conflict once the first has finished: a finished call is not replayed for other arguments.
    assert await claim(ar, first) == ("run", 1)
    assert await settle(ar, first, 1, done_record(first)) is True
    assert await submit(ar, second, request_id=RID, arguments=b'{"n":2}') == Submission("conflict", first)


async def test_submit_over_max_pending_is_full_and_writes_nothing(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    for _ in range(2):
        assert (await submit(ar, new_id(), max_pending=2)).kind == "new"
    before = sorted(r.keys())
    third = new_id()
    assert await submit(ar, third, request_id=RID, max_pending=2) == Submission("full", pending=2)
    assert sorted(r.keys()) == before
    assert not r.exists(keys.idempotency(PRINCIPAL, None, RID), keys.execution(third), jobs.job_key(third))
    assert r.zcard(keys.pending(PARTITION)) == 2 and r.zcard(keys.queued(PARTITION)) == 2 and r.zcard(QUEUE) == 2
    assert r.llen(WAKE) == 2  # the two queued ones' tokens, and no more
    # Nothing was recorded, so the same request_id is accepted once there is room.
    r.zpopmin(keys.pending(PARTITION))
    assert await submit(ar, third, request_id=RID, max_pending=2) == Submission("new", third)


@pytest.mark.usefixtures("cells")
async def test_each_partition_admits_its_share_of_max_pending_rounded_up(ar: redis.asyncio.Redis) -> None:
    """CARMY_MAX_PENDING over N partitions: SUBMIT sees its own partition only, which admits
    ceil(M/N) (docs/architecture.md, "Admission across partitions"): a full partition refuses
    while another still admits."""
    count = keys.partition_count()
    total = 2 * count - 1  # a share of 2 from two partitions on (of 1 with one)
    share = 2 if count > 1 else 1

    async def admit(exec_id: str) -> Submission:
        return await Submit(ar, retention=RETENTION)(
            execution_job(exec_id), group=GROUP, idempotent=False, workers_alive=True, max_pending=total,
            queue_wait_ms=MINUTE_MS, admission_ms=MINUTE_MS)

    for _ in range(share):
        assert (await admit(keys.new_execution_id(0))).kind == "new"
    assert await admit(keys.new_execution_id(0)) == Submission("full", pending=share)
    elsewhere = keys.new_execution_id(count - 1)
    assert await admit(elsewhere) == (Submission("new", elsewhere) if count > 1 else Submission("full", pending=1))


async def test_submit_without_live_workers_writes_nothing(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    assert await submit(ar, new_id(), request_id=RID, workers_alive=False) == Submission("no_workers")
    assert r.dbsize() == 0  # no wake token either


async def test_submit_prunes_expired_admission_entries_before_counting(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    now = redis_now_ms(r)
    r.zadd(keys.pending(PARTITION), {"exec_crashed": now - 1, "exec_alive": now + MINUTE_MS})
    fresh = new_id()
    # The crashed execution's slot is given back; the live one still counts.
    assert await submit(ar, fresh, max_pending=2) == Submission("new", fresh)
    assert sorted(r.zrange(keys.pending(PARTITION), 0, -1)) == sorted([b"exec_alive", fresh.encode()])
    assert await submit(ar, new_id(), max_pending=2) == Submission("full", pending=2)


# --- CLAIM -----------------------------------------------------------------------------------


async def test_claim_runs_a_queued_execution(r: redis.Redis, ar: redis.asyncio.Redis, listen: Any) -> None:
    exec_id = new_id()
    await submit(ar, exec_id)
    events = listen(keys.events(exec_id))
    assert await claim(ar, exec_id, "w1") == ("run", 1)
    h = state(r, exec_id)
    assert (h["state"], h["attempt"], h["worker"]) == ("running", "1", "w1")
    assert r.sismember(keys.running("w1", PARTITION), exec_id)
    assert not in_zset(r, keys.queued(PARTITION), exec_id)  # started: the start deadline no longer applies
    assert in_zset(r, keys.pending(PARTITION), exec_id)  # still holds its admission slot
    [(_, data)] = received(events)
    event = event_decoder.decode(data)
    assert event.name == "tool.started"
    assert event.data == json_encoder.encode(StartedData(exec_id, "tally"))
    waits = r.hgetall(metrics.histogram("queue_wait", PARTITION))
    buckets = [int(v) for k, v in waits.items() if k.split(metrics.SEP.encode())[1].isdigit()]
    assert buckets == [1] and f"tally{metrics.SEP}sum".encode() in waits  # one observation, no count field


async def test_claim_of_a_settled_execution_does_not_run(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    exec_id = await running(ar, idempotent=True)
    assert await settle(ar, exec_id, 1, done_record(exec_id)) is True
    assert await claim(ar, exec_id, "w2") == ("settled", 0)
    assert state(r, exec_id)["attempt"] == "1"
    assert not r.sismember(keys.running("w2", PARTITION), exec_id)


async def test_claim_of_an_unknown_execution_is_gone_and_creates_nothing(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    assert await claim(ar, new_id()) == ("gone", 0)
    assert r.dbsize() == 0


async def test_claim_of_an_execution_whose_hash_expired_under_a_late_write_is_gone(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    # What a progress message written after the hash expired leaves: no state, no start-by.
    exec_id = new_id()
    r.hset(keys.execution(exec_id), mapping={"message": "50%", "message_at": 1})
    assert await claim(ar, exec_id) == ("gone", 0)
    assert r.hgetall(keys.execution(exec_id)) == {b"message": b"50%", b"message_at": b"1"}  # no attempt counted


async def test_claim_of_a_cancelled_execution_does_not_run(
    r: redis.Redis, ar: redis.asyncio.Redis, listen: Any,
) -> None:
    # Cancelled while running on w1, which then died: the re-delivered job must not run it.
    exec_id = await running(ar, idempotent=True)
    assert (await cancel(ar, exec_id))[0] == "signalled"
    assert (await reap(ar, exec_id, "w1"))[0] == "requeued"
    events = listen(keys.events(exec_id))
    assert await claim(ar, exec_id, "w2") == ("cancelled", 2)
    assert not r.sismember(keys.running("w2", PARTITION), exec_id)
    assert state(r, exec_id)["state"] == "queued"
    assert received(events) == []  # no tool.started


async def test_claim_never_runs_a_non_idempotent_execution_twice(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    exec_id = await running(ar)
    assert await claim(ar, exec_id, "w2") == ("uncertain", 2)  # arq re-delivered it
    assert not r.sismember(keys.running("w2", PARTITION), exec_id)
    assert state(r, exec_id)["worker"] == "w1"


async def test_claim_reruns_an_idempotent_execution_up_to_max_attempts(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    assert MAX_ATTEMPTS == 3
    exec_id = await running(ar, idempotent=True)
    assert await claim(ar, exec_id, "w2") == ("run", 2)
    assert await claim(ar, exec_id, "w3") == ("run", 3)
    assert await claim(ar, exec_id, "w4") == ("uncertain", 4)
    assert state(r, exec_id)["worker"] == "w3"
    assert not r.sismember(keys.running("w4", PARTITION), exec_id)


async def test_claim_after_the_start_deadline_expires_on_the_first_attempt_only(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    late = new_id()
    await submit(ar, late, queue_wait_ms=-1)  # its start-by instant has passed
    assert await claim(ar, late) == ("expired", 1)
    assert state(r, late)["state"] == "queued"
    assert not r.sismember(keys.running("w1", PARTITION), late)

    # Once started in time, a re-run after a crash is not "never started".
    rerun = await running(ar, idempotent=True)
    r.hset(keys.execution(rerun), "start_by", 0)
    assert await claim(ar, rerun, "w2") == ("run", 2)


# --- SETTLE ----------------------------------------------------------------------------------


async def test_settle_writes_the_record_once_and_announces_it(
    r: redis.Redis, ar: redis.asyncio.Redis, listen: Any,
) -> None:
    exec_id = await running(ar)
    events = listen(keys.events(exec_id))
    record = done_record(exec_id)
    assert await settle(ar, exec_id, 1, record, run_ms=42) is True

    assert r.get(keys.record(exec_id)) == stored(record)
    assert RETENTION - 1 <= r.ttl(keys.record(exec_id)) <= RETENTION
    assert state(r, exec_id)["state"] == "done"
    assert not in_zset(r, keys.pending(PARTITION), exec_id)
    assert not in_zset(r, keys.queued(PARTITION), exec_id)
    assert not r.sismember(keys.running("w1", PARTITION), exec_id)
    got = [event_decoder.decode(data) for _, data in received(events)]
    assert [e.name for e in got] == ["tool.completed", "final"]
    assert got[1].data == stored(record)
    assert r.hget(metrics.executions(PARTITION), metrics.label(record)) == b"1"
    run = metrics.histogram("run", PARTITION)
    bucket = metrics.BUCKETS_MS.index(50)  # 25 < 42 <= 50
    assert r.hget(run, f"tally{metrics.SEP}{bucket}") == b"1"
    assert r.hget(run, f"tally{metrics.SEP}sum") == b"42"
    assert sorted(r.hkeys(run)) == sorted(f"tally{metrics.SEP}{part}".encode() for part in (bucket, "sum"))

    # Never overwritten, not even by the same attempt.
    assert await settle(ar, exec_id, 1, done_record(exec_id, n=2)) is False
    assert r.get(keys.record(exec_id)) == stored(record)
    assert r.hget(metrics.executions(PARTITION), metrics.label(record)) == b"1"
    assert received(events) == []


async def test_settle_without_a_run_publishes_only_the_final_event(
    r: redis.Redis, ar: redis.asyncio.Redis, listen: Any,
) -> None:
    exec_id = await running(ar)
    assert await claim(ar, exec_id, "w2") == ("uncertain", 2)
    events = listen(keys.events(exec_id))
    record = records.uncertain(exec_id, "tally", "its worker stopped")
    assert await settle(ar, exec_id, 2, record, worker_id="w2", run_ms=None, completed=False, ran=False) is True
    assert event_names(events) == ["final"]
    assert r.hget(metrics.executions(PARTITION), metrics.label(record)) == b"1"
    assert not r.exists(metrics.histogram("run", PARTITION))


async def test_settle_of_a_stale_attempt_writes_nothing(r: redis.Redis, ar: redis.asyncio.Redis, listen: Any) -> None:
    exec_id = await running(ar, idempotent=True)
    assert await claim(ar, exec_id, "w2") == ("run", 2)
    events = listen(keys.events(exec_id))
    # w1 was paused, not dead: it wakes up with attempt 1's outcome.
    assert await settle(ar, exec_id, 1, done_record(exec_id, n=1)) is False
    assert not r.exists(keys.record(exec_id))
    assert state(r, exec_id)["state"] == "running"
    assert in_zset(r, keys.pending(PARTITION), exec_id)
    assert received(events) == []
    assert not r.exists(metrics.executions(PARTITION))

    record = done_record(exec_id, n=2)
    assert await settle(ar, exec_id, 2, record, worker_id="w2") is True
    assert record_decoder.decode(r.get(keys.record(exec_id))).body == record.body
    assert await settle(ar, exec_id, 1, done_record(exec_id, n=1)) is False
    assert record_decoder.decode(r.get(keys.record(exec_id))).body == record.body


@pytest.mark.parametrize("size", [MAX_EVENT_BYTES - 1024, MAX_EVENT_BYTES + 1])
async def test_settle_announces_a_large_record_without_it(
    r: redis.Redis, ar: redis.asyncio.Redis, listen: Any, size: int,
) -> None:
    # A subscriber of pub/sub is dropped by Redis when its output buffer overflows: a large record
    # is stored whole but announced empty, and readers GET it.
    exec_id = await running(ar)
    events = listen(keys.events(exec_id))
    record = records.completed(exec_id, "tally", json_encoder.encode("x" * size), cacheable=False, duration_ms=1)
    assert await settle(ar, exec_id, 1, record) is True
    assert r.get(keys.record(exec_id)) == stored(record)
    final = [event_decoder.decode(data) for _, data in received(events)][-1]
    assert final.name == "final"
    assert final.data == (stored(record) if len(stored(record)) <= MAX_EVENT_BYTES else b"")


# --- CANCEL ----------------------------------------------------------------------------------


async def test_cancel_of_a_queued_execution_settles_it_at_once(
    r: redis.Redis, ar: redis.asyncio.Redis, listen: Any,
) -> None:
    exec_id = new_id()
    await submit(ar, exec_id)
    events = listen(keys.events(exec_id))
    outcome, written = await cancel(ar, exec_id)
    assert outcome == "cancelled"
    assert r.get(keys.record(exec_id)) == written
    record = record_decoder.decode(written)
    assert (record.status, record.error_code, record.status_code) == ("cancelled", "CANCELLED", 408)
    assert RETENTION - 1 <= r.ttl(keys.record(exec_id)) <= RETENTION
    h = state(r, exec_id)
    assert (h["state"], h["attempt"], h["cancel"]) == ("done", "1", "1")
    assert not in_zset(r, keys.pending(PARTITION), exec_id)
    assert not in_zset(r, keys.queued(PARTITION), exec_id)
    got = received(events)
    assert [event_decoder.decode(d).name for _, d in got] == ["final"]
    assert event_decoder.decode(got[0][1]).data == written
    assert r.hget(metrics.executions(PARTITION), metrics.label(record)) == b"1"
    # When a worker picks the job up, it never runs.
    assert await claim(ar, exec_id) == ("settled", 0)


async def test_cancel_of_a_running_execution_signals_its_worker(
    r: redis.Redis, ar: redis.asyncio.Redis, listen: Any,
) -> None:
    exec_id = await running(ar)
    channels = listen(keys.cancel_channel(PARTITION), keys.events(exec_id))
    assert (await cancel(ar, exec_id))[0] == "signalled"
    assert received(channels) == [(keys.cancel_channel(PARTITION), exec_id.encode())]
    assert not r.exists(keys.record(exec_id))
    h = state(r, exec_id)
    assert (h["state"], h["attempt"], h["cancel"]) == ("running", "1", "1")
    assert in_zset(r, keys.pending(PARTITION), exec_id)
    assert r.sismember(keys.running("w1", PARTITION), exec_id)
    # The worker answers with the record of the cancelled run: it still owns the attempt.
    assert await settle(ar, exec_id, 1, records.cancelled(exec_id, "tally", started=True)) is True


async def test_cancel_of_a_settled_execution_changes_nothing(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    exec_id = await running(ar)
    assert await settle(ar, exec_id, 1, done_record(exec_id)) is True
    record = r.get(keys.record(exec_id))
    before = state(r, exec_id)
    assert (await cancel(ar, exec_id))[0] == "settled"
    assert r.get(keys.record(exec_id)) == record
    assert state(r, exec_id) == before


async def test_cancel_of_an_unknown_execution_is_gone(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    assert (await cancel(ar, new_id()))[0] == "gone"
    assert r.dbsize() == 0


# --- REAP ------------------------------------------------------------------------------------


async def test_reap_requeues_an_idempotent_execution_of_a_dead_worker(
    r: redis.Redis, ar: redis.asyncio.Redis, listen: Any,
) -> None:
    exec_id = await running(ar, idempotent=True)
    r.set(jobs.in_progress_key(exec_id), b"1", px=MINUTE_MS)  # w1's arq lease on the job
    r.zadd(QUEUE, {exec_id: redis_now_ms(r) + MINUTE_MS})  # where LEASE put it: the lease's end
    r.delete(WAKE)
    channels = listen(keys.events(exec_id))
    assert (await reap(ar, exec_id, "w1"))[0] == "requeued"
    assert state(r, exec_id)["state"] == "queued"
    assert not r.exists(jobs.in_progress_key(exec_id))  # another worker may take the job now
    assert not r.sismember(keys.running("w1", PARTITION), exec_id)
    assert not r.exists(keys.record(exec_id))
    assert in_zset(r, keys.pending(PARTITION), exec_id)
    assert r.zscore(QUEUE, exec_id) <= redis_now_ms(r)  # due again now, not when the lease would end
    assert r.llen(WAKE) == 1 and received(channels) == []
    assert await claim(ar, exec_id, "w2") == ("run", 2)


async def test_reap_gives_a_requeued_execution_its_start_window_again_from_then(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    exec_id = await running(ar, idempotent=True)
    window = 30_000  # as if SUBMIT had been given a queue timeout of 30 s
    r.hset(keys.execution(exec_id), "start_by", int(state(r, exec_id)["queued_at"]) + window)
    for attempt, worker in ((1, "w1"), (2, "w2")):
        if attempt == 2:
            assert await claim(ar, exec_id, worker) == ("run", 2)
            assert not in_zset(r, keys.queued(PARTITION), exec_id)  # the claim takes it out again
        assert (await reap(ar, exec_id, worker))[0] == "requeued"
        h = state(r, exec_id)
        # The same window each time, from the requeue: not from the submit, nor growing.
        assert int(h["start_by"]) == int(h["requeued_at"]) + window
        assert r.zscore(keys.queued(PARTITION), exec_id) == int(h["start_by"])
        assert await sweep(ar) == [0]  # not late yet
        assert not r.exists(keys.record(exec_id))


async def test_a_requeued_execution_no_worker_starts_again_in_time_is_settled_timeout(
    r: redis.Redis, ar: redis.asyncio.Redis, listen: Any,
) -> None:
    exec_id = await running(ar, idempotent=True)
    # A window over as soon as it is put back: the janitor's next sweep finds it late.
    r.hset(keys.execution(exec_id), "start_by", int(state(r, exec_id)["queued_at"]) - 1)
    assert (await reap(ar, exec_id, "w1"))[0] == "requeued"
    events = listen(keys.events(exec_id))
    assert await sweep(ar) == [1]
    written = r.get(keys.record(exec_id))
    assert written == stored(records.not_restarted(exec_id, "tally"))
    record = record_decoder.decode(written)
    assert (record.status_code, record.error_code) == (504, "TIMEOUT")
    assert b"put back in the queue" in record.body
    assert event_names(events) == ["final"]
    assert not in_zset(r, keys.queued(PARTITION), exec_id)
    assert not in_zset(r, keys.pending(PARTITION), exec_id)  # its admission slot is free again
    assert await claim(ar, exec_id, "w2") == ("settled", 0)  # the job, redelivered, finds the record


async def test_reap_settles_a_non_idempotent_execution_uncertain(
    r: redis.Redis, ar: redis.asyncio.Redis, listen: Any,
) -> None:
    exec_id = await running(ar)
    r.set(jobs.in_progress_key(exec_id), b"1", px=MINUTE_MS)
    r.delete(WAKE)
    events = listen(keys.events(exec_id))
    outcome, written = await reap(ar, exec_id, "w1")
    assert outcome == "uncertain"
    assert r.get(keys.record(exec_id)) == written
    record = record_decoder.decode(written)
    assert (record.status_code, record.error_code) == (409, "EXECUTION_UNCERTAIN")
    h = state(r, exec_id)
    assert (h["state"], h["attempt"]) == ("done", "2")
    assert not r.exists(jobs.in_progress_key(exec_id))
    assert not in_zset(r, keys.pending(PARTITION), exec_id)
    assert not r.sismember(keys.running("w1", PARTITION), exec_id)
    assert event_names(events) == ["final"]
    assert r.llen(WAKE) == 1  # the job is redelivered (and finds the record) rather than left waiting
    # The dead worker's late outcome is fenced out, and the re-delivered job never runs.
    assert await settle(ar, exec_id, 1, done_record(exec_id)) is False
    assert r.get(keys.record(exec_id)) == written
    assert await claim(ar, exec_id, "w2") == ("settled", 0)


async def test_reap_of_an_execution_that_moved_on_writes_nothing(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    exec_id = await running(ar, idempotent=True)
    assert await claim(ar, exec_id, "w2") == ("run", 2)  # arq re-delivered it to w2
    r.set(jobs.in_progress_key(exec_id), b"1", px=MINUTE_MS)  # w2's lease
    before = state(r, exec_id)
    assert (await reap(ar, exec_id, "w1"))[0] == "moved"
    assert state(r, exec_id) == before
    assert r.exists(jobs.in_progress_key(exec_id))
    assert not r.exists(keys.record(exec_id))
    assert r.sismember(keys.running("w2", PARTITION), exec_id)
    assert not r.sismember(keys.running("w1", PARTITION), exec_id)  # the stale entry is dropped


async def test_reap_of_a_settled_execution_only_drops_the_stale_entry(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    exec_id = await running(ar)
    record = done_record(exec_id)
    assert await settle(ar, exec_id, 1, record) is True
    r.sadd(keys.running("w1", PARTITION), exec_id)  # an entry left behind (a write Redis lost, say)
    assert (await reap(ar, exec_id, "w1"))[0] == "settled"
    assert r.get(keys.record(exec_id)) == stored(record)
    assert not r.sismember(keys.running("w1", PARTITION), exec_id)


# --- EXPIRE_UNSTARTED ------------------------------------------------------------------------


async def test_expire_unstarted_settles_an_execution_past_its_start_deadline(
    r: redis.Redis, ar: redis.asyncio.Redis, listen: Any,
) -> None:
    exec_id = new_id()
    await submit(ar, exec_id, queue_wait_ms=-1)
    events = listen(keys.events(exec_id))
    outcome, written = await expire(ar, exec_id)
    assert outcome is True
    assert r.get(keys.record(exec_id)) == written
    record = record_decoder.decode(written)
    assert (record.status_code, record.status, record.error_code) == (504, "timed_out", "TIMEOUT")
    assert "never ran" in record.body.decode()
    h = state(r, exec_id)
    assert (h["state"], h["attempt"]) == ("done", "1")
    assert not in_zset(r, keys.queued(PARTITION), exec_id)
    assert not in_zset(r, keys.pending(PARTITION), exec_id)
    assert event_names(events) == ["final"]
    assert await claim(ar, exec_id) == ("settled", 0)


async def test_expire_unstarted_leaves_an_execution_not_yet_due(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    exec_id = new_id()
    await submit(ar, exec_id)
    assert (await expire(ar, exec_id))[0] is False
    assert in_zset(r, keys.queued(PARTITION), exec_id)
    assert in_zset(r, keys.pending(PARTITION), exec_id)
    assert not r.exists(keys.record(exec_id))
    assert state(r, exec_id)["state"] == "queued"
    assert await claim(ar, exec_id) == ("run", 1)


async def test_expire_unstarted_only_unlists_a_running_execution(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    exec_id = await running(ar)
    r.zadd(keys.queued(PARTITION), {exec_id: 0})  # a stale entry, read before the claim removed it
    assert (await expire(ar, exec_id))[0] is False
    assert not in_zset(r, keys.queued(PARTITION), exec_id)
    assert not r.exists(keys.record(exec_id))
    assert state(r, exec_id)["state"] == "running"


# --- Janitor (JANITOR_SCAN, then REAP and EXPIRE_UNSTARTED) ---------------------------------


async def sweep(ar: redis.asyncio.Redis, times: int = 1) -> list[int]:
    janitor = Janitor(ar, retention=RETENTION, dead_after=3.0)
    return [await janitor.sweep() for _ in range(times)]


async def test_janitor_reaps_only_the_executions_of_dead_workers(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    await heartbeat(ar, "dead", -10_000)
    await heartbeat(ar, "alive")
    lost = await running(ar, worker_id="dead")
    requeued = await running(ar, idempotent=True, worker_id="dead")
    kept = await running(ar, worker_id="alive")
    assert await sweep(ar) == [2]
    assert record_decoder.decode(r.get(keys.record(lost))).error_code == "EXECUTION_UNCERTAIN"
    assert state(r, requeued)["state"] == "queued" and not r.exists(keys.record(requeued))
    assert state(r, kept)["state"] == "running" and not r.exists(keys.record(kept))
    assert r.sismember(keys.running("alive", keys.partition_of(kept)), kept)
    assert sum(r.scard(keys.running("dead", p)) for p in keys.partitions()) == 0
    assert in_zset(r, keys.workers(0), "dead")  # recently dead: still remembered


async def test_janitor_forgets_long_departed_workers_once_they_hold_nothing(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    long_ago = -(DEPARTED_MEMORY_S * 1000 + 1000)
    for worker_id, offset in (("idle", long_ago), ("busy", long_ago), ("recent", -10_000)):
        r.set(keys.worker(worker_id), b"info")
        r.sadd(keys.draining(0), worker_id)
        await heartbeat(ar, worker_id, offset)
    # Held in partition 0, whose scan is the one that forgets a worker's info (partition 0's): each
    # partition forgets a worker that holds nothing there, whatever it holds elsewhere.
    held = await running(ar, worker_id="busy", partition=0)

    def remembered(worker_id: str) -> tuple[bool, bool, bool]:
        return (bool(r.exists(keys.worker(worker_id))), in_zset(r, keys.workers(0), worker_id),
                bool(r.sismember(keys.draining(0), worker_id)))

    assert await sweep(ar) == [1]  # the busy worker's execution
    assert remembered("idle") == (False, False, False)
    assert remembered("busy") == (True, True, True)  # it held an execution when scanned
    assert remembered("recent") == (True, True, True)
    assert r.exists(keys.record(held))
    assert await sweep(ar) == [0]
    assert remembered("busy") == (False, False, False)
    assert remembered("recent") == (True, True, True)


async def test_janitor_settles_executions_that_never_started_in_time(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    late, waiting = new_id(), new_id()
    await submit(ar, late, queue_wait_ms=-1)
    await submit(ar, waiting)
    assert await sweep(ar) == [1]
    assert record_decoder.decode(r.get(keys.record(late))).error_code == "TIMEOUT"
    assert not r.exists(keys.record(waiting))
    assert in_zset(r, keys.queued(keys.partition_of(waiting)), waiting)


# --- arq lease (store.leases.Lease) -----------------------------------------------------------


async def test_lease_takes_only_due_unleased_jobs_at_most_n_by_redis_clock(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    leases = Leases(ar, "w1")  # any asyncio client runs it; the workers pass their ArqRedis
    now = redis_now_ms(r)
    due1, due2, due3, later, taken = (new_id() for _ in range(5))
    r.zadd(QUEUE, {due1: now - 300, due2: now - 200, due3: now - 100, later: now + MINUTE_MS, taken: now - 400})
    r.set(jobs.in_progress_key(taken), b"other", px=MINUTE_MS)

    r.set(jobs.job_key(due1), b"job one")

    async def take(n: int) -> list[tuple[str, int]]:
        got = await leases.take(QUEUE, most=n, lease_ms=5000, look_ahead=100)
        for lease in got:  # each lease's token is in arq's in-progress key and in the worker's hash
            assert lease.token.startswith("w1/") and lease.token.endswith(lease.job_id)
            assert r.get(jobs.in_progress_key(lease.job_id)) == lease.token.encode()
            assert r.hget(keys.leases("w1", PARTITION), lease.job_id) == lease.token.encode()
            # Its score is the lease's end now: the next scans for due jobs do not walk over it.
            assert redis_now_ms(r) + 4000 < r.zscore(QUEUE, lease.job_id) <= redis_now_ms(r) + 5000
            # arq's run counter is not kept: arq's run_job is told the attempt (none here: 1).
            assert not r.exists(jobs.retry_key(lease.job_id)) and lease.runs == 1
        return [(lease.job_id, lease.score, lease.job) for lease in got]

    # Each with its arq job ('' when gone).
    assert await take(2) == [(due1, now - 300, b"job one"), (due2, now - 200, b"")]
    for job_id in (due1, due2):
        assert 4000 < r.pttl(jobs.in_progress_key(job_id)) <= 5000
    assert not r.exists(jobs.in_progress_key(due3), jobs.in_progress_key(later))
    assert r.get(jobs.in_progress_key(taken)) == b"other"
    assert r.pttl(jobs.in_progress_key(taken)) > 5000
    # The next call takes what is left and due, and nothing twice.
    assert await take(5) == [(due3, now - 100, b"")]
    assert await take(5) == []


@pytest.mark.parametrize("tool", ["t", "tally", "a.b-c_d", "x" * 128])
def test_the_started_event_a_script_builds_is_the_workers_byte_for_byte(r: redis.Redis, tool: str) -> None:
    exec_id = new_id()
    built = r.eval(STARTED + "return started_event(ARGV[1], ARGV[2])", 0, exec_id, tool)
    assert built == started_event(exec_id, tool)


async def test_lease_claims_each_job_it_leases(r: redis.Redis, ar: redis.asyncio.Redis, listen: Any) -> None:
    """LEASE claims the execution of each job it leases, as CLAIM would, in the same round trip.
    A claim does not begin the tool: BEGIN does, just before a non-idempotent tool starts."""
    plain, other, cancelled = new_id(), new_id(), new_id()
    await submit(ar, plain)
    await submit(ar, other, tool="serial")
    await submit(ar, cancelled)
    r.hset(keys.execution(cancelled), "cancel", "1")
    events = listen(keys.events(plain))
    got = {lease.job_id: lease.claim for lease in
           await Leases(ar, "w1").take(QUEUE, most=3, lease_ms=MINUTE_MS, look_ahead=10)}
    assert {e: (c.verdict, c.attempt) for e, c in got.items() if c} == {
        plain: ("run", 1), other: ("run", 1), cancelled: ("cancelled", 1)}
    assert r.smembers(keys.running("w1", PARTITION)) == {plain.encode(), other.encode()}
    assert all(state(r, e)["worker"] == "w1" and "began" not in state(r, e) for e in (plain, other))
    [(_, data)] = received(events)
    assert data == started_event(plain, "tally")


async def test_a_claimed_execution_whose_tool_never_began_goes_to_another_worker(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    """A worker stopped after its LEASE (one sent behind a BLPOP runs even while it is stopped):
    its non-idempotent execution never began, so REAP gives it to another worker rather than
    settling it uncertain. Once BEGIN marked it, it would be uncertain."""
    exec_id = new_id()
    await submit(ar, exec_id)
    [lease] = await Leases(ar, "w1").take(QUEUE, most=1, lease_ms=MINUTE_MS, look_ahead=10)
    assert lease.claim is not None and lease.claim.verdict == "run"
    assert (await reap(ar, exec_id, "w1"))[0] == "requeued"
    assert await Attempts(ar, worker_id="w1", retention=RETENTION).begin(exec_id, 1) is False  # too late
    [again] = await Leases(ar, "w2").take(QUEUE, most=1, lease_ms=MINUTE_MS, look_ahead=10)
    assert again.claim is not None and (again.claim.verdict, again.claim.attempt) == ("run", 2)
    assert await Attempts(ar, worker_id="w2", retention=RETENTION).begin(exec_id, 2) is True
    assert state(r, exec_id)["began"] == "2"
    assert (await reap(ar, exec_id, "w2"))[0] == "uncertain"


async def test_a_lease_waits_for_the_replicas_asked_for(
    r: redis.Redis, ar: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture,
) -> None:
    """LEASE claims, and a claim a failover loses resets the attempt count: with
    CARMY_REDIS_WAIT_REPLICAS it is followed by WAIT, as CLAIM was."""
    exec_id = new_id()
    await submit(ar, exec_id)
    with caplog.at_level(logging.WARNING, logger="carmy.store"):
        [lease] = await Leases(ar, "w1", durability=Durability(1, timeout_ms=20)).take(
            QUEUE, most=1, lease_ms=MINUTE_MS, look_ahead=10)
    assert lease.claim is not None and lease.claim.verdict == "run"
    assert "writes reach 0 of the 1 replicas" in caplog.text  # this server has none
    # So is the LEASE that goes out with a BLPOP.
    durability = Durability(1, timeout_ms=20)
    again = new_id()
    await submit(ar, again)
    [lease] = await Leases(ar, "w1", durability=durability).wait_and_take(
        ar, QUEUE, timeout=1, most=1, lease_ms=MINUTE_MS, look_ahead=10)
    assert lease.job_id == again and durability._short  # the WAIT fell short, and it heard so
    # A poll that claims nothing waits for no replica: it has nothing to protect.
    waits = r.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
    assert await Leases(ar, "w1", durability=durability).wait_and_take(
        ar, QUEUE, timeout=0.05, most=1, lease_ms=MINUTE_MS, look_ahead=10) == []
    assert r.info("commandstats")["cmdstat_wait"]["calls"] == waits


async def test_a_wait_for_a_token_brings_the_lease_with_it(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    """BLPOP and LEASE go out together: Redis leases (and claims) the job the moment its token is
    popped, and the worker gets both in one reply."""
    waiting = asyncio.create_task(Leases(ar, "w1").wait_and_take(ar, QUEUE, timeout=10, most=2, lease_ms=MINUTE_MS,
                                                                   look_ahead=10))
    deadline = time.monotonic() + 10
    while not any(c["cmd"] == "blpop" and "b" in c["flags"] for c in r.client_list()):
        assert time.monotonic() < deadline, "the wait never blocked"
        await asyncio.sleep(0.01)
    exec_id = new_id()
    await submit(ar, exec_id)
    [lease] = await asyncio.wait_for(waiting, 10)
    assert lease.job_id == exec_id and lease.claim is not None and lease.claim.verdict == "run"
    assert r.llen(WAKE) == 0 and state(r, exec_id)["worker"] == "w1"


async def test_a_wait_that_times_out_still_leases_what_is_due(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    """The fallback poll: a due job that has no token (its token went to a worker that was not
    looking) is leased when the wait times out."""
    exec_id = new_id()
    await submit(ar, exec_id)
    r.delete(WAKE)
    [lease] = await Leases(ar, "w1").wait_and_take(ar, QUEUE, timeout=0.05, most=2, lease_ms=MINUTE_MS, look_ahead=10)
    assert lease.job_id == exec_id


async def test_a_wait_on_a_server_without_the_script_loads_it_and_leases(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    exec_id = new_id()
    await submit(ar, exec_id)
    r.script_flush()  # a new primary, say
    [lease] = await Leases(ar, "w1").wait_and_take(ar, QUEUE, timeout=1, most=2, lease_ms=MINUTE_MS, look_ahead=10)
    assert lease.job_id == exec_id and lease.claim is not None and lease.claim.attempt == 1


async def test_a_lease_leaves_one_wake_token_per_job_still_due(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    """Tokens left for jobs already leased would each wake a worker for nothing; but a due job
    that never pushed a token of its own (put back after a Retry) must not take another's."""
    for _ in range(3):
        await submit(ar, new_id())
    assert r.llen(WAKE) == 3
    assert r.lpop(WAKE) is not None  # the BLPOP that woke this worker
    assert len(await Leases(ar, "w1").take(QUEUE, most=2, lease_ms=MINUTE_MS, look_ahead=10)) == 2
    assert r.llen(WAKE) == 1  # for the one job still due
    # A look without a token of its own (a slot freed, the fallback poll) takes the job's token.
    assert len(await Leases(ar, "w2").take(QUEUE, most=2, lease_ms=MINUTE_MS, look_ahead=10)) == 1
    assert r.llen(WAKE) == 0
    assert await Leases(ar, "w3").take(QUEUE, most=2, lease_ms=MINUTE_MS, look_ahead=10) == []
    # A job back in the queue without a token (a Retry defers it: FINISH wakes nobody), and two
    # new ones: leasing one of the three leaves a token for each of the two still due.
    retried = new_id()
    await submit(ar, retried)
    [lease] = await Leases(ar, "w4").take(QUEUE, most=1, lease_ms=MINUTE_MS, look_ahead=10)
    r.lpop(WAKE)
    assert await Leases(ar, "w4").finish(lease, finished=False, delay_ms=0)
    assert r.llen(WAKE) == 0
    await submit(ar, new_id())
    await submit(ar, new_id())
    assert r.lpop(WAKE) is not None
    assert len(await Leases(ar, "w5").take(QUEUE, most=1, lease_ms=MINUTE_MS, look_ahead=10)) == 1
    assert r.llen(WAKE) == 2  # one for each job still due, the retried one included


async def test_finish_ends_only_its_own_lease(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    done, retried, taken_away = new_id(), new_id(), new_id()
    for exec_id in (done, retried, taken_away):
        await submit(ar, exec_id)
    leases = Leases(ar, "w1")
    got = {lease.job_id: lease for lease in await leases.take(QUEUE, most=3, lease_ms=MINUTE_MS, look_ahead=10)}
    assert set(got) == {done, retried, taken_away}
    r.delete(WAKE)
    # Finished: the job is gone for good.
    assert await leases.finish(got[done], finished=True, delay_ms=None) is True
    assert not r.exists(jobs.job_key(done), jobs.in_progress_key(done), jobs.retry_key(done))
    assert not in_zset(r, QUEUE, done)
    assert r.llen(WAKE) == 0
    # A retry: the job stays queued, later (from its score before the lease), and anyone may lease it.
    assert await leases.finish(got[retried], finished=False, delay_ms=1000) is True
    assert r.exists(jobs.job_key(retried)) and not r.exists(jobs.in_progress_key(retried))
    assert r.zscore(QUEUE, retried) == got[retried].score + 1000
    assert r.llen(WAKE) == 0  # due later: the fallback poll finds it
    # The janitor gave this lease away and another worker leased the job: a late finish of the
    # old lease touches nothing.
    r.set(jobs.in_progress_key(taken_away), b"w2/new")
    assert await leases.finish(got[taken_away], finished=True, delay_ms=None) is False
    assert r.exists(jobs.job_key(taken_away)) and in_zset(r, QUEUE, taken_away)
    assert r.get(jobs.in_progress_key(taken_away)) == b"w2/new"
    assert r.hlen(keys.leases("w1", PARTITION)) == 0


async def test_settle_with_the_lease_finishes_the_job_as_finish_would(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    """SETTLE with the lease's token ends the lease too: no FINISH round trip after it. A lease
    that is no longer this one's is left alone, as FINISH would leave it."""
    mine, taken_away = new_id(), new_id()
    for exec_id in (mine, taken_away):
        await submit(ar, exec_id)
    got = {lease.job_id: lease for lease in
           await Leases(ar, "w1").take(QUEUE, most=2, lease_ms=MINUTE_MS, look_ahead=10)}
    attempts = Attempts(ar, worker_id="w1", retention=RETENTION, group=GROUP)
    for exec_id in (mine, taken_away):  # LEASE claimed them for w1
        assert got[exec_id].claim == Claim("run", 1, got[exec_id].claim.queue_wait_ms)
    assert await attempts.settle(done_record(mine), exec_id=mine, attempt=1, lease=got[mine].token) is True
    assert not r.exists(jobs.job_key(mine), jobs.in_progress_key(mine), jobs.retry_key(mine))
    assert not in_zset(r, QUEUE, mine) and not r.hexists(keys.leases("w1", PARTITION), mine)
    # FINISH after it, as arq would call it, finds nothing left of the lease.
    assert await Leases(ar, "w1").finish(got[mine], finished=True, delay_ms=None) is False
    # Its lease ran out while it ran (a pause) and another worker leased the job since.
    r.set(jobs.in_progress_key(taken_away), b"w2/new")
    assert await attempts.settle(done_record(taken_away), exec_id=taken_away, attempt=1,
                                 lease=got[taken_away].token) is True
    assert r.get(jobs.in_progress_key(taken_away)) == b"w2/new"
    assert r.exists(jobs.job_key(taken_away)) and in_zset(r, QUEUE, taken_away)
    assert not r.hexists(keys.leases("w1", PARTITION), taken_away)


async def test_janitor_puts_back_jobs_a_dead_worker_leased_and_never_claimed(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    unclaimed, claimed, kept = new_id(), new_id(), new_id()
    await submit(ar, claimed, idempotent=True)
    [lease] = await Leases(ar, "dead").take(QUEUE, most=2, lease_ms=MINUTE_MS, look_ahead=10)
    assert lease.claim is not None and (lease.claim.verdict, lease.claim.attempt) == ("run", 1)
    # A lease with no claim, as a worker of before (LEASE, then CLAIM) could leave it.
    await submit(ar, unclaimed, idempotent=True)
    r.set(jobs.in_progress_key(unclaimed), f"dead/old/{unclaimed}", px=MINUTE_MS)
    r.hset(keys.leases("dead", keys.partition_of(unclaimed)), unclaimed, f"dead/old/{unclaimed}")
    r.zadd(QUEUE, {unclaimed: redis_now_ms(r) + MINUTE_MS}, xx=True)
    await submit(ar, kept)
    await Leases(ar, "alive").take(QUEUE, most=1, lease_ms=MINUTE_MS, look_ahead=10)
    await heartbeat(ar, "dead", -10_000)
    await heartbeat(ar, "alive")
    r.delete(WAKE)
    assert await sweep(ar) == [2]
    # Both of the dead worker's jobs can be leased again at once, and idle workers were woken.
    assert not r.exists(jobs.in_progress_key(unclaimed), jobs.in_progress_key(claimed))
    assert state(r, claimed)["state"] == "queued"
    assert sum(r.hlen(keys.leases("dead", p)) for p in keys.partitions()) == 0
    assert r.llen(WAKE) == 2  # one token each
    assert max(r.zscore(QUEUE, unclaimed), r.zscore(QUEUE, claimed)) <= redis_now_ms(r)
    # The live worker's lease is untouched.
    assert r.get(jobs.in_progress_key(kept)) == r.hget(keys.leases("alive", keys.partition_of(kept)), kept)
    got = await Leases(ar, "w2").take(QUEUE, most=5, lease_ms=MINUTE_MS, look_ahead=10)
    assert {lease.job_id for lease in got} == {unclaimed, claimed}


async def test_reap_keeps_a_lease_another_worker_took_and_honours_the_attempt(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    exec_id = await running(ar, idempotent=True)
    r.hset(keys.leases("w1", PARTITION), exec_id, b"w1/old")
    r.set(jobs.in_progress_key(exec_id), b"w2/new")  # w1's lease ran out, and w2 leased the job
    # A reap for another attempt than the current one does nothing.
    outcome = await Verdicts(ar, retention=RETENTION).reap(exec_id, "tally", worker_id="w1", why="x", attempt=2)
    assert outcome == "moved"
    assert r.sismember(keys.running("w1", PARTITION), exec_id)
    assert (await reap(ar, exec_id, "w1"))[0] == "requeued"
    assert r.get(jobs.in_progress_key(exec_id)) == b"w2/new"
    assert not r.hexists(keys.leases("w1", PARTITION), exec_id)


async def test_a_reaped_attempt_can_neither_settle_nor_hold(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    exec_id = await running(ar, idempotent=True)
    attempts = Attempts(ar, worker_id="w1", retention=RETENTION)
    assert await attempts.holds(exec_id, 1) is True
    assert await attempts.holds(exec_id, 2) is False
    assert await Attempts(ar, worker_id="w2", retention=RETENTION).holds(exec_id, 1) is False  # not its claim
    assert (await reap(ar, exec_id, "w1"))[0] == "requeued"
    # The paused worker wakes up: its attempt no longer holds the execution, and what it would
    # write (a result, or the cancellation its loss caused) is refused.
    assert await attempts.holds(exec_id, 1) is False
    assert await settle(ar, exec_id, 1, done_record(exec_id)) is False
    assert not r.exists(keys.record(exec_id))
    assert await claim(ar, exec_id, "w2") == ("run", 2)
    assert await settle(ar, exec_id, 2, done_record(exec_id), worker_id="w2") is True
    assert await attempts.holds(exec_id, 2) is False  # settled


async def test_the_status_is_the_running_attempts_and_a_rerun_starts_without_the_last_ones(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    """The status message of a running execution (what MCP's ``tasks/get`` and the console show)
    is the progress message of the attempt that runs it: none at a rerun's claim (its work starts
    over), and nothing the first attempt sends once it woke late (a sync tool's thread goes on)
    is published or kept."""
    exec_id = await running(ar, idempotent=True)
    exe = keys.execution(exec_id)
    first, second = Progress(ar, worker_id="w1"), Progress(ar, worker_id="w2")
    assert await first(exec_id, 1, b"event", "halfway")
    assert r.hget(exe, "message") == b"halfway"
    assert (await reap(ar, exec_id, "w1"))[0] == "requeued"
    assert await claim(ar, exec_id, "w2") == ("run", 2)
    assert r.hmget(exe, "message", "message_at") == [None, None]
    assert await first(exec_id, 1, b"event", "done at last") is False
    assert await second(exec_id, 1, b"event", "not its attempt") is False
    assert r.hget(exe, "message") is None
    assert await second(exec_id, 2, b"event", "starting over")
    assert r.hget(exe, "message") == b"starting over"


@pytest.mark.usefixtures("beat_parts")
async def test_heartbeat_reports_what_its_worker_no_longer_holds(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    mine, locked, unlocked, stray, requeued, moved = [await running(ar, idempotent=True) for _ in range(6)]
    r.set(keys.lock("tally"), lock_holder(locked, 1))
    r.set(keys.lock("other"), lock_holder("exec_someone_else", 1))
    assert (await reap(ar, requeued, "w1"))[0] == "requeued"
    assert (await reap(ar, moved, "w1"))[0] == "requeued"
    assert await claim(ar, moved, "w2") == ("run", 2)
    r.sadd(keys.running("w1", keys.partition_of(moved)), moved)  # as if w1's entry had been left behind
    held = (Holding(mine, 1), Holding(locked, 1, keys.lock("tally")), Holding(unlocked, 1, keys.lock("other")),
            Holding(requeued, 1), Holding(moved, 1))
    beat = await heartbeat(ar, "w1", held=held)
    assert sorted(beat.lost) == sorted([requeued, moved])
    assert beat.unlocked == [unlocked]
    assert beat.strays == [Stray(stray, 1, "tally")]
    assert beat.registered is False  # no worker info was ever written in this test


def epoch_of(r: redis.Redis) -> str:
    """What HEARTBEAT calls the serving Redis: its run id and replication id."""
    server, replication = r.info("server"), r.info("replication")
    return f"{server['run_id']}/{replication['master_replid']}"


async def test_a_beat_of_losses_only_finds_every_execution_taken_from_its_worker(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    """Between full beats, a worker learns what it lost from the scripts that took it (REAP,
    another worker's claim), not by reading every execution it holds: the same verdicts, for
    each way of losing one, as the full beat above gives."""
    mine, locked, unlocked, requeued, moved, taken = [await running(ar, idempotent=True) for _ in range(6)]
    held = [Holding(mine, 1), Holding(locked, 1, keys.lock("tally")), Holding(unlocked, 1, keys.lock("other")),
            Holding(requeued, 1), Holding(moved, 1), Holding(taken, 1)]
    liveness = SyncLiveness(r, dead_after=3.0)
    full = liveness.heartbeat("w1", claims=Claims(held=held))
    assert full.lost == [] and not full.stale
    assert full.epochs == [epoch_of(r)] * keys.partition_count()
    r.set(keys.lock("tally"), lock_holder(locked, 1))
    r.set(keys.lock("other"), lock_holder("exec_someone_else", 1))
    assert (await reap(ar, requeued, "w1"))[0] == "requeued"  # w1 was paused past dead_after
    assert (await reap(ar, moved, "w1"))[0] == "requeued"
    assert await claim(ar, moved, "w2") == ("run", 2)
    assert await claim(ar, taken, "w2") == ("run", 2)  # its job leased again while w1 ran it
    # A write no script of the store makes: only a full beat sees it (what a Redis crash or a
    # failover could leave, which changes the epoch).
    r.hset(keys.execution(mine), "reaped", 1)
    attempts = {h.execution_id: h.attempt for h in held}
    beat = liveness.check_losses("w1", epochs=full.epochs, locked=[h for h in held if h.lock],
                                 attempt_of=attempts.get)
    assert sorted(beat.lost) == sorted([requeued, moved, taken])
    assert beat.unlocked == [unlocked]
    assert (beat.strays, beat.orphans, beat.stale) == ([], [], False)
    again = liveness.check_losses("w1", epochs=full.epochs, locked=[], attempt_of=attempts.get)
    assert again.lost == []  # read once
    assert sorted(liveness.heartbeat("w1", claims=Claims(held=held)).lost) == sorted([mine, requeued, moved, taken])
    # Each beat marked the worker seen.
    assert all(r.zscore(keys.workers(p), "w1") for p in keys.partitions())


async def test_a_beat_of_losses_only_on_another_redis_checks_nothing_and_says_so(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    """After a restart or a failover (another epoch), the set of losses may miss some: the beat
    reads nothing and says the worker must check everything, which then finds them."""
    exec_id = await running(ar, idempotent=True)
    assert (await reap(ar, exec_id, "w1"))[0] == "requeued"
    liveness = SyncLiveness(r, dead_after=3.0)
    before = ["0" * 40 + "/" + "0" * 40] * keys.partition_count()
    beat = liveness.check_losses("w1", epochs=before, locked=[], attempt_of={exec_id: 1}.get)
    assert beat.stale and beat.lost == []
    assert beat.epochs == [epoch_of(r)] * keys.partition_count()
    assert r.sismember(keys.lost("w1", keys.partition_of(exec_id)), exec_id)  # left for the full beat
    full = liveness.heartbeat("w1", claims=Claims(held=[Holding(exec_id, 1)]))
    assert full.lost == [exec_id]
    assert not r.exists(keys.lost("w1", keys.partition_of(exec_id)))  # which drains it


async def test_liveness_after_a_gap_counts_only_what_could_be_observed(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    now = redis_now_ms(r)
    # Redis was unreachable for the last 5 s (nothing marked it watched), after a long quiet run.
    for p in keys.partitions():  # every partition's copy of the roster saw the same
        r.hset(keys.watch(p), mapping={"seen": now - 5000, "since": now - MINUTE_MS, "from": now - MINUTE_MS})
        r.zadd(keys.workers(p), {"cut_off": now - 6000, "dead_before": now - 9000})
    cut_off = await running(ar, worker_id="cut_off")
    dead_before = await running(ar, worker_id="dead_before")
    roster = await Liveness(ar, dead_after=3.0).roster(0)
    assert (roster.alive("cut_off"), roster.alive("dead_before")) == (True, False)
    # Only the worker that was already dead when the gap began is judged now.
    assert await sweep(ar) == [1]
    assert r.exists(keys.record(dead_before)) and not r.exists(keys.record(cut_off))
    # A worker that does not reassert itself within one dead-after period of the gap's end is dead.
    for p in keys.partitions():
        r.hset(keys.watch(p), mapping={"seen": redis_now_ms(r), "since": redis_now_ms(r) - 3001})
    assert (await Liveness(ar, dead_after=3.0).roster(0)).alive("cut_off") is False
    assert await sweep(ar) == [1]
    assert record_decoder.decode(r.get(keys.record(cut_off))).error_code == "EXECUTION_UNCERTAIN"


async def test_short_gaps_between_observations_change_nothing(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    now = redis_now_ms(r)
    for p in keys.partitions():
        r.hset(keys.watch(p), mapping={"seen": now - 500, "since": now - MINUTE_MS, "from": now - MINUTE_MS})
        r.zadd(keys.workers(p), {"silent": now - 3500})
    exec_id = await running(ar, worker_id="silent")
    assert await sweep(ar) == [1]
    assert r.exists(keys.record(exec_id))


async def test_a_lease_taken_away_before_its_claim_claims_nothing(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    """A worker paused between its lease and its CLAIM (a job run under no claiming lease): the
    janitor gave its job to another worker, which runs it. The late CLAIM must not take a second
    attempt (a non-idempotent execution would be judged uncertain under the worker that is
    running it)."""
    exec_id = new_id()
    await submit(ar, exec_id)
    stale = f"w1/old/{exec_id}"  # w1's lease, its claim not made yet
    r.set(jobs.in_progress_key(exec_id), stale, px=MINUTE_MS)
    r.delete(jobs.in_progress_key(exec_id))  # what JANITOR_SCAN does for a dead worker's lease
    [fresh] = await Leases(ar, "w2").take(QUEUE, most=1, lease_ms=MINUTE_MS, look_ahead=10)
    assert fresh.claim is not None and (fresh.claim.verdict, fresh.claim.attempt) == ("run", 1)
    late = await Attempts(ar, worker_id="w1", retention=RETENTION).claim(exec_id, max_attempts=3,
                                                                         lease=stale)
    assert late.verdict == "moved"
    assert state(r, exec_id)["attempt"] == "1" and state(r, exec_id)["worker"] == "w2"


@pytest.mark.usefixtures("beat_parts")
async def test_heartbeat_claims_again_what_a_redis_crash_lost(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    """Redis lost the last second of writes, this worker's CLAIM among them: its heartbeat claims
    the execution again, so its outcome is recorded and a redelivered job does not run it."""
    exec_id = new_id()
    await submit(ar, exec_id)  # as Redis has it after the crash: queued, attempt 0
    beat = await heartbeat(ar, "w1", held=(Holding(exec_id, 1),))
    assert beat.lost == [] and beat.strays == []
    assert (state(r, exec_id)["attempt"], state(r, exec_id)["state"]) == ("1", "running")
    partition = keys.partition_of(exec_id)
    assert r.sismember(keys.running("w1", partition), exec_id) and not in_zset(r, keys.queued(partition), exec_id)
    assert await claim(ar, exec_id, "w2") == ("uncertain", 2)  # a redelivery: never a second run
    # Two claims with the same number (the crash took the first): only the claimer's record counts.
    other = new_id()
    await submit(ar, other)
    assert await claim(ar, other, "w2") == ("run", 1)
    assert await settle(ar, other, 1, done_record(other), worker_id="w1") is False
    assert await settle(ar, other, 1, done_record(other), worker_id="w2") is True


async def test_reap_of_an_idempotent_execution_whose_job_is_gone_settles_it(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    """Nothing could run it again: it ends uncertain rather than queued for ever."""
    exec_id = await running(ar, idempotent=True)
    r.delete(jobs.job_key(exec_id))
    assert (await reap(ar, exec_id, "w1"))[0] == "uncertain"
    assert record_decoder.decode(r.get(keys.record(exec_id))).error_code == "EXECUTION_UNCERTAIN"


@pytest.mark.usefixtures("beat_parts")
async def test_heartbeat_releases_a_lease_its_worker_never_heard_of(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    """A LEASE whose reply was lost with the connection: the job is leased to a live worker that
    does not know it. Two heartbeats later it is free again, not when the lease expires."""
    known, unknown = new_id(), new_id()
    for exec_id in (known, unknown):
        await submit(ar, exec_id)
    leases = {lease.job_id: lease for lease in
              await Leases(ar, "w1").take(QUEUE, most=2, lease_ms=MINUTE_MS, look_ahead=10)}
    first = await heartbeat(ar, "w1", claims=Claims(jobs=[known]))
    assert first.orphans == [Orphan(unknown, leases[unknown].token)]
    assert r.exists(jobs.in_progress_key(unknown))  # one beat is not enough: its reply may be on its way
    r.delete(WAKE)
    second = await heartbeat(ar, "w1", claims=Claims(jobs=[known], release=first.orphans))
    assert second.orphans == []
    assert not r.exists(jobs.in_progress_key(unknown))
    assert not r.hexists(keys.leases("w1", keys.partition_of(unknown)), unknown)
    assert r.llen(WAKE) == 1 and r.zscore(QUEUE, unknown) <= redis_now_ms(r)  # due again now
    assert r.get(jobs.in_progress_key(known)) == leases[known].token.encode()
    # A lease that the worker has by the second beat (its reply came late) is kept.
    late = new_id()
    await submit(ar, late)
    again = {lease.job_id: lease for lease in
             await Leases(ar, "w1").take(QUEUE, most=2, lease_ms=MINUTE_MS, look_ahead=10)}
    assert set(again) == {unknown, late}  # the released job was free to be leased again
    third = await heartbeat(ar, "w1", claims=Claims(jobs=[known]))
    await heartbeat(ar, "w1", claims=Claims(jobs=[known, late], release=third.orphans))
    assert r.get(jobs.in_progress_key(late)) == again[late].token.encode()
    assert not r.exists(jobs.in_progress_key(unknown))


async def test_a_non_idempotent_execution_whose_tool_never_began_is_tried_again(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    """A ``parallel_safe=False`` tool waits for its lock after CLAIM: if its worker dies while it
    waits, the tool never began, so the execution is not uncertain; it runs again elsewhere."""
    exec_id = new_id()
    await submit(ar, exec_id)
    waiting = await Attempts(ar, worker_id="w1", retention=RETENTION).claim(
        exec_id, max_attempts=MAX_ATTEMPTS)
    assert (waiting.verdict, waiting.attempt) == ("run", 1)
    assert (await reap(ar, exec_id, "w1"))[0] == "requeued"
    assert not r.exists(keys.record(exec_id))
    again = await Attempts(ar, worker_id="w2", retention=RETENTION).claim(
        exec_id, max_attempts=MAX_ATTEMPTS)
    assert (again.verdict, again.attempt) == ("run", 2)
    # Once an attempt has begun the tool (it took the lock), a later one is uncertain.
    never = asyncio.Event()
    lock = ToolLock(ToolLocks(ar, worker_id="w2"), "tally", exec_id, 2)
    assert await lock.acquire(1, never) == "taken"
    assert state(r, exec_id)["began"] == "2"
    assert (await reap(ar, exec_id, "w2"))[0] == "uncertain"
    # Its renewer would outlive the test, and its connection be collected in some later one.
    await lock.release()


async def test_an_attempt_given_away_while_it_waited_for_its_lock_takes_nothing(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    exec_id = new_id()
    await submit(ar, exec_id, idempotent=True)
    await Attempts(ar, worker_id="w1", retention=RETENTION).claim(exec_id, max_attempts=3)
    assert (await reap(ar, exec_id, "w1"))[0] == "requeued"  # w1 was paused while it waited
    never = asyncio.Event()
    assert await ToolLock(ToolLocks(ar, worker_id="w1"), "tally", exec_id, 1).acquire(1, never) == "lost"
    assert not r.exists(keys.lock("tally")) and "began" not in state(r, exec_id)


async def test_a_wake_list_nobody_pops_stays_bounded(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    await ar.eval(jobs.WAKE_ONE + f"for _ = 1, {jobs.WAKE_LIMIT + 5} do wake_one(KEYS[1]) end", 1, WAKE)
    assert r.llen(WAKE) == jobs.WAKE_LIMIT
