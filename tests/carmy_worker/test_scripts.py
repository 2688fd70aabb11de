"""The Lua scripts, one branch at a time, against the real Redis.

Every state change of an execution goes through one of these scripts; a wrong branch here is a
call that runs twice, never ends, or answers twice. Payloads and records are built with the
same helpers the API and the workers use.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.client import PubSub

from carmy_worker import keys, metrics, queue, records, scripts
from carmy_worker.janitor import DEPARTED_MEMORY_S, Janitor
from carmy_worker.runtime import MAX_ATTEMPTS, CompletedData, StartedData
from carmy_worker.wire import (
    Event,
    ExecutionJob,
    Record,
    event_decoder,
    json_encoder,
    msgpack_encoder,
    record_decoder,
)
from tests.support import RedisServer

RETENTION = 600
GROUP = "g1"
QUEUE = queue.queue_name(GROUP)
WAKE = queue.wake_channel(QUEUE)
MINUTE_MS = 60_000


@pytest.fixture
def r(sync_redis: redis.Redis) -> redis.Redis:
    sync_redis.flushall()
    return sync_redis


def redis_now_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def new_id() -> str:
    return keys.new_execution_id()


def job_bytes(exec_id: str, tool: str) -> bytes:
    job = ExecutionJob(execution_id=exec_id, tool=tool, arguments=b"{}")
    return queue.encode_job(msgpack_encoder.encode(job), int(time.time() * 1000))


def submit(
    r: redis.Redis, exec_id: str, *, request_id: str | None = None, fingerprint: str = "fp-1", tool: str = "tally",
    idempotent: bool = False, workers_alive: bool = True, max_pending: int = 10, deadline_ms: int = MINUTE_MS,
    queue_wait_ms: int = MINUTE_MS, job: bytes | None = None,
) -> list[Any]:
    redis_keys = [keys.execution(exec_id), keys.PENDING, keys.QUEUED, queue.job_key(exec_id), QUEUE]
    if request_id is not None:
        redis_keys.append(keys.idempotency("alice", None, request_id))
    return r.register_script(scripts.SUBMIT)(keys=redis_keys, args=[
        exec_id, fingerprint, job or job_bytes(exec_id, tool), RETENTION, max_pending, deadline_ms, queue_wait_ms,
        1 if workers_alive else 0, tool, keys.owner("alice"), 1 if idempotent else 0, keys.RECORD_PREFIX, WAKE,
    ])


def started_event(exec_id: str, tool: str) -> bytes:
    return msgpack_encoder.encode(Event("tool.started", json_encoder.encode(StartedData(exec_id, tool))))


def claim(r: redis.Redis, exec_id: str, worker_id: str = "w1", tool: str = "tally") -> tuple[str, int]:
    verdict, attempt, _waited = r.register_script(scripts.CLAIM)(
        keys=[keys.execution(exec_id), keys.record(exec_id), keys.running(worker_id), keys.QUEUED],
        args=[exec_id, worker_id, MAX_ATTEMPTS, keys.events(exec_id), started_event(exec_id, tool), tool],
    )
    return verdict.decode(), int(attempt)


def done_record(exec_id: str, tool: str = "tally", n: int = 1) -> Record:
    return records.completed(exec_id, tool, b'{"n":%d}' % n, cacheable=False, duration_ms=42)


def settle(r: redis.Redis, exec_id: str, attempt: int, record: Record, *, worker_id: str = "w1",
           run_ms: int | None = 42, completed: bool = True) -> int:
    stored, final = records.final_event(record)
    done = msgpack_encoder.encode(Event("tool.completed", json_encoder.encode(
        CompletedData(exec_id, record.tool, run_ms or 0, record.status == "completed")))) if completed else b""
    return int(r.register_script(scripts.SETTLE)(
        keys=[keys.execution(exec_id), keys.record(exec_id), keys.PENDING, keys.running(worker_id), keys.QUEUED],
        args=[exec_id, attempt, stored, RETENTION, keys.events(exec_id), final, done, metrics.label(record),
              record.tool, "" if run_ms is None else run_ms],
    ))


def cancel(r: redis.Redis, exec_id: str, tool: str = "tally") -> tuple[str, bytes]:
    stored, final = records.final_event(records.cancelled(exec_id, tool, started=False))
    outcome = r.register_script(scripts.CANCEL)(
        keys=[keys.execution(exec_id), keys.record(exec_id), keys.PENDING, keys.QUEUED],
        args=[exec_id, stored, RETENTION, keys.events(exec_id), final, keys.CANCEL_CHANNEL,
              metrics.label(records.cancelled(exec_id, tool, started=False))],
    )
    return outcome.decode(), stored


def reap(r: redis.Redis, exec_id: str, worker_id: str, tool: str = "tally") -> tuple[str, bytes]:
    record = records.uncertain(exec_id, tool, "its worker stopped responding")
    stored, final = records.final_event(record)
    outcome = r.register_script(scripts.REAP)(
        keys=[keys.execution(exec_id), keys.record(exec_id), keys.PENDING, keys.running(worker_id),
              queue.in_progress_key(exec_id)],
        args=[exec_id, worker_id, stored, RETENTION, keys.events(exec_id), final, metrics.label(record)],
    )
    return outcome.decode(), stored


def expire(r: redis.Redis, exec_id: str, tool: str = "tally") -> tuple[int, bytes]:
    record = records.never_started(exec_id, tool)
    stored, final = records.final_event(record)
    outcome = r.register_script(scripts.EXPIRE_UNSTARTED)(
        keys=[keys.execution(exec_id), keys.record(exec_id), keys.PENDING, keys.QUEUED],
        args=[exec_id, stored, RETENTION, keys.events(exec_id), final, metrics.label(record)],
    )
    return int(outcome), stored


def heartbeat(r: redis.Redis, worker_id: str, offset_ms: int = 0) -> None:
    r.register_script(scripts.HEARTBEAT)(keys=[keys.WORKERS, keys.worker(worker_id)], args=[worker_id, offset_ms])


@pytest.fixture
def listen(r: redis.Redis) -> Iterator[Any]:
    """``listen(*channels)`` subscribes (confirmed) and returns the pubsub to read from."""
    opened: list[PubSub] = []

    def subscribe(*channels: str) -> PubSub:
        p = r.pubsub()
        opened.append(p)
        p.subscribe(*channels)
        for _ in channels:
            message = p.get_message(timeout=2)
            assert message is not None and message["type"] == "subscribe"
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
        if message is not None and message["type"] == "message":
            out.append((message["channel"].decode(), message["data"]))
    return out


def event_names(p: PubSub, wait: float = 0.2) -> list[str]:
    return [event_decoder.decode(data).name for _, data in received(p, wait)]


def state(r: redis.Redis, exec_id: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(keys.execution(exec_id)).items()}


def in_zset(r: redis.Redis, zset: str, member: str) -> bool:
    return r.zscore(zset, member) is not None


def running(r: redis.Redis, *, idempotent: bool = False, request_id: str | None = None,
            worker_id: str = "w1") -> str:
    """A new execution, claimed by ``worker_id`` (attempt 1)."""
    exec_id = new_id()
    submit(r, exec_id, idempotent=idempotent, request_id=request_id)
    assert claim(r, exec_id, worker_id) == ("run", 1)
    return exec_id


# --- SUBMIT ----------------------------------------------------------------------------------


def test_submit_new_writes_execution_job_admission_and_idempotency(r: redis.Redis, listen: Any) -> None:
    wake = listen(WAKE)
    exec_id = new_id()
    job = job_bytes(exec_id, "tally")
    before = redis_now_ms(r)
    assert submit(r, exec_id, request_id="rid", job=job, deadline_ms=90_000, queue_wait_ms=30_000) == [
        b"new", exec_id.encode()]
    after = redis_now_ms(r)

    h = state(r, exec_id)
    assert (h["state"], h["attempt"], h["tool"], h["owner"], h["idem"], h["wake"]) == (
        "queued", "0", "tally", keys.owner("alice"), "0", WAKE)
    assert before + 30_000 <= int(h["start_by"]) <= after + 30_000
    assert RETENTION - 1 <= r.ttl(keys.execution(exec_id)) <= RETENTION
    assert before + 90_000 <= r.zscore(keys.PENDING, exec_id) <= after + 90_000
    assert r.zscore(keys.QUEUED, exec_id) == int(h["start_by"])
    assert r.get(queue.job_key(exec_id)) == job
    assert RETENTION - 1 <= r.ttl(queue.job_key(exec_id)) <= RETENTION
    assert in_zset(r, QUEUE, exec_id)
    idem = keys.idempotency("alice", None, "rid")
    assert r.get(idem) == f"{exec_id} fp-1".encode()
    assert RETENTION - 1 <= r.ttl(idem) <= RETENTION
    assert received(wake) == [(WAKE, b"")]  # an idle worker looks at the queue at once


def test_submit_same_request_while_running_joins_the_original(r: redis.Redis) -> None:
    first = new_id()
    submit(r, first, request_id="rid")
    second = new_id()
    assert submit(r, second, request_id="rid") == [b"join", first.encode()]
    assert not r.exists(keys.execution(second), queue.job_key(second))
    assert r.zcard(keys.PENDING) == 1 and r.zcard(QUEUE) == 1


def test_submit_same_request_after_the_record_replays_it(r: redis.Redis) -> None:
    first = running(r, request_id="rid")
    assert settle(r, first, 1, done_record(first)) == 1
    stored = r.get(keys.record(first))
    second = new_id()
    assert submit(r, second, request_id="rid") == [b"replay", first.encode(), stored]
    assert not r.exists(keys.execution(second), queue.job_key(second))


def test_submit_same_request_with_other_arguments_conflicts(r: redis.Redis) -> None:
    first = new_id()
    submit(r, first, request_id="rid", fingerprint="fp-1")
    second = new_id()
    assert submit(r, second, request_id="rid", fingerprint="fp-2") == [b"conflict", first.encode()]
    assert not r.exists(keys.execution(second), queue.job_key(second))
    # Still a conflict once the first has finished: a finished call is not replayed for other arguments.
    assert claim(r, first) == ("run", 1)
    assert settle(r, first, 1, done_record(first)) == 1
    assert submit(r, second, request_id="rid", fingerprint="fp-2") == [b"conflict", first.encode()]


def test_submit_over_max_pending_is_full_and_writes_nothing(r: redis.Redis, listen: Any) -> None:
    for _ in range(2):
        assert submit(r, new_id(), max_pending=2)[0] == b"new"
    before = sorted(r.keys())
    wake = listen(WAKE)
    third = new_id()
    assert submit(r, third, request_id="rid", max_pending=2) == [b"full", b"2"]
    assert sorted(r.keys()) == before
    assert not r.exists(keys.idempotency("alice", None, "rid"), keys.execution(third), queue.job_key(third))
    assert r.zcard(keys.PENDING) == 2 and r.zcard(keys.QUEUED) == 2 and r.zcard(QUEUE) == 2
    assert received(wake) == []
    # Nothing was recorded, so the same request_id is accepted once there is room.
    r.zpopmin(keys.PENDING)
    assert submit(r, third, request_id="rid", max_pending=2) == [b"new", third.encode()]


def test_submit_without_live_workers_writes_nothing(r: redis.Redis, listen: Any) -> None:
    wake = listen(WAKE)
    assert submit(r, new_id(), request_id="rid", workers_alive=False) == [b"no_workers"]
    assert r.dbsize() == 0
    assert received(wake) == []


def test_submit_prunes_expired_admission_entries_before_counting(r: redis.Redis) -> None:
    now = redis_now_ms(r)
    r.zadd(keys.PENDING, {"exec_crashed": now - 1, "exec_alive": now + MINUTE_MS})
    fresh = new_id()
    # The crashed execution's slot is given back; the live one still counts.
    assert submit(r, fresh, max_pending=2) == [b"new", fresh.encode()]
    assert sorted(r.zrange(keys.PENDING, 0, -1)) == sorted([b"exec_alive", fresh.encode()])
    assert submit(r, new_id(), max_pending=2) == [b"full", b"2"]


# --- CLAIM -----------------------------------------------------------------------------------


def test_claim_runs_a_queued_execution(r: redis.Redis, listen: Any) -> None:
    exec_id = new_id()
    submit(r, exec_id)
    events = listen(keys.events(exec_id))
    assert claim(r, exec_id, "w1") == ("run", 1)
    h = state(r, exec_id)
    assert (h["state"], h["attempt"], h["worker"]) == ("running", "1", "w1")
    assert r.sismember(keys.running("w1"), exec_id)
    assert not in_zset(r, keys.QUEUED, exec_id)  # started: the start deadline no longer applies
    assert in_zset(r, keys.PENDING, exec_id)  # still holds its admission slot
    [(_, data)] = received(events)
    event = event_decoder.decode(data)
    assert event.name == "tool.started"
    assert event.data == json_encoder.encode(StartedData(exec_id, "tally"))
    assert r.hget(metrics.HISTOGRAMS["queue_wait"], f"tally{metrics.SEP}count") == b"1"


def test_claim_of_a_settled_execution_does_not_run(r: redis.Redis) -> None:
    exec_id = running(r, idempotent=True)
    assert settle(r, exec_id, 1, done_record(exec_id)) == 1
    assert claim(r, exec_id, "w2") == ("settled", 0)
    assert state(r, exec_id)["attempt"] == "1"
    assert not r.sismember(keys.running("w2"), exec_id)


def test_claim_of_an_unknown_execution_is_gone_and_creates_nothing(r: redis.Redis) -> None:
    assert claim(r, new_id()) == ("gone", 0)
    assert r.dbsize() == 0


def test_claim_of_a_cancelled_execution_does_not_run(r: redis.Redis, listen: Any) -> None:
    # Cancelled while running on w1, which then died: the re-delivered job must not run it.
    exec_id = running(r, idempotent=True)
    assert cancel(r, exec_id)[0] == "signalled"
    assert reap(r, exec_id, "w1")[0] == "requeued"
    events = listen(keys.events(exec_id))
    assert claim(r, exec_id, "w2") == ("cancelled", 2)
    assert not r.sismember(keys.running("w2"), exec_id)
    assert state(r, exec_id)["state"] == "queued"
    assert received(events) == []  # no tool.started


def test_claim_never_runs_a_non_idempotent_execution_twice(r: redis.Redis) -> None:
    exec_id = running(r)
    assert claim(r, exec_id, "w2") == ("uncertain", 2)  # arq re-delivered it
    assert not r.sismember(keys.running("w2"), exec_id)
    assert state(r, exec_id)["worker"] == "w1"


def test_claim_reruns_an_idempotent_execution_up_to_max_attempts(r: redis.Redis) -> None:
    assert MAX_ATTEMPTS == 3
    exec_id = running(r, idempotent=True)
    assert claim(r, exec_id, "w2") == ("run", 2)
    assert claim(r, exec_id, "w3") == ("run", 3)
    assert claim(r, exec_id, "w4") == ("uncertain", 4)
    assert state(r, exec_id)["worker"] == "w3"
    assert not r.sismember(keys.running("w4"), exec_id)


def test_claim_after_the_start_deadline_expires_on_the_first_attempt_only(r: redis.Redis) -> None:
    late = new_id()
    submit(r, late, queue_wait_ms=-1)  # its start-by instant has passed
    assert claim(r, late) == ("expired", 1)
    assert state(r, late)["state"] == "queued"
    assert not r.sismember(keys.running("w1"), late)

    # Once started in time, a re-run after a crash is not "never started".
    rerun = running(r, idempotent=True)
    r.hset(keys.execution(rerun), "start_by", 0)
    assert claim(r, rerun, "w2") == ("run", 2)


# --- SETTLE ----------------------------------------------------------------------------------


def test_settle_writes_the_record_once_and_announces_it(r: redis.Redis, listen: Any) -> None:
    exec_id = running(r)
    events = listen(keys.events(exec_id))
    record = done_record(exec_id)
    stored, _ = records.final_event(record)
    assert settle(r, exec_id, 1, record, run_ms=42) == 1

    assert r.get(keys.record(exec_id)) == stored
    assert RETENTION - 1 <= r.ttl(keys.record(exec_id)) <= RETENTION
    assert state(r, exec_id)["state"] == "done"
    assert not in_zset(r, keys.PENDING, exec_id)
    assert not in_zset(r, keys.QUEUED, exec_id)
    assert not r.sismember(keys.running("w1"), exec_id)
    got = [event_decoder.decode(data) for _, data in received(events)]
    assert [e.name for e in got] == ["tool.completed", "final"]
    assert got[1].data == stored
    assert r.hget(metrics.EXECUTIONS, metrics.label(record)) == b"1"
    run = metrics.HISTOGRAMS["run"]
    bucket = metrics.BUCKETS_MS.index(50)  # 25 < 42 <= 50
    assert r.hget(run, f"tally{metrics.SEP}{bucket}") == b"1"
    assert r.hget(run, f"tally{metrics.SEP}sum") == b"42"
    assert r.hget(run, f"tally{metrics.SEP}count") == b"1"

    # Never overwritten, not even by the same attempt.
    assert settle(r, exec_id, 1, done_record(exec_id, n=2)) == 0
    assert r.get(keys.record(exec_id)) == stored
    assert r.hget(metrics.EXECUTIONS, metrics.label(record)) == b"1"
    assert received(events) == []


def test_settle_without_a_run_publishes_only_the_final_event(r: redis.Redis, listen: Any) -> None:
    exec_id = running(r)
    assert claim(r, exec_id, "w2") == ("uncertain", 2)
    events = listen(keys.events(exec_id))
    record = records.uncertain(exec_id, "tally", "its worker stopped")
    assert settle(r, exec_id, 2, record, worker_id="w2", run_ms=None, completed=False) == 1
    assert event_names(events) == ["final"]
    assert r.hget(metrics.EXECUTIONS, metrics.label(record)) == b"1"
    assert not r.exists(metrics.HISTOGRAMS["run"])


def test_settle_of_a_stale_attempt_writes_nothing(r: redis.Redis, listen: Any) -> None:
    exec_id = running(r, idempotent=True)
    assert claim(r, exec_id, "w2") == ("run", 2)
    events = listen(keys.events(exec_id))
    # w1 was paused, not dead: it wakes up with attempt 1's outcome.
    assert settle(r, exec_id, 1, done_record(exec_id, n=1)) == 0
    assert not r.exists(keys.record(exec_id))
    assert state(r, exec_id)["state"] == "running"
    assert in_zset(r, keys.PENDING, exec_id)
    assert received(events) == []
    assert not r.exists(metrics.EXECUTIONS)

    record = done_record(exec_id, n=2)
    assert settle(r, exec_id, 2, record, worker_id="w2") == 1
    assert record_decoder.decode(r.get(keys.record(exec_id))).body == record.body
    assert settle(r, exec_id, 1, done_record(exec_id, n=1)) == 0
    assert record_decoder.decode(r.get(keys.record(exec_id))).body == record.body


# --- CANCEL ----------------------------------------------------------------------------------


def test_cancel_of_a_queued_execution_settles_it_at_once(r: redis.Redis, listen: Any) -> None:
    exec_id = new_id()
    submit(r, exec_id)
    events = listen(keys.events(exec_id))
    outcome, stored = cancel(r, exec_id)
    assert outcome == "cancelled"
    assert r.get(keys.record(exec_id)) == stored
    record = record_decoder.decode(stored)
    assert (record.status, record.error_code, record.status_code) == ("cancelled", "CANCELLED", 408)
    assert RETENTION - 1 <= r.ttl(keys.record(exec_id)) <= RETENTION
    h = state(r, exec_id)
    assert (h["state"], h["attempt"], h["cancel"]) == ("done", "1", "1")
    assert not in_zset(r, keys.PENDING, exec_id)
    assert not in_zset(r, keys.QUEUED, exec_id)
    got = received(events)
    assert [event_decoder.decode(d).name for _, d in got] == ["final"]
    assert event_decoder.decode(got[0][1]).data == stored
    assert r.hget(metrics.EXECUTIONS, metrics.label(record)) == b"1"
    # When a worker picks the job up, it never runs.
    assert claim(r, exec_id) == ("settled", 0)


def test_cancel_of_a_running_execution_signals_its_worker(r: redis.Redis, listen: Any) -> None:
    exec_id = running(r)
    channels = listen(keys.CANCEL_CHANNEL, keys.events(exec_id))
    assert cancel(r, exec_id)[0] == "signalled"
    assert received(channels) == [(keys.CANCEL_CHANNEL, exec_id.encode())]
    assert not r.exists(keys.record(exec_id))
    h = state(r, exec_id)
    assert (h["state"], h["attempt"], h["cancel"]) == ("running", "1", "1")
    assert in_zset(r, keys.PENDING, exec_id)
    assert r.sismember(keys.running("w1"), exec_id)
    # The worker answers with the record of the cancelled run: it still owns the attempt.
    assert settle(r, exec_id, 1, records.cancelled(exec_id, "tally", started=True)) == 1


def test_cancel_of_a_settled_execution_changes_nothing(r: redis.Redis) -> None:
    exec_id = running(r)
    assert settle(r, exec_id, 1, done_record(exec_id)) == 1
    stored = r.get(keys.record(exec_id))
    before = state(r, exec_id)
    assert cancel(r, exec_id)[0] == "settled"
    assert r.get(keys.record(exec_id)) == stored
    assert state(r, exec_id) == before


def test_cancel_of_an_unknown_execution_is_gone(r: redis.Redis) -> None:
    assert cancel(r, new_id())[0] == "gone"
    assert r.dbsize() == 0


# --- REAP ------------------------------------------------------------------------------------


def test_reap_requeues_an_idempotent_execution_of_a_dead_worker(r: redis.Redis, listen: Any) -> None:
    exec_id = running(r, idempotent=True)
    r.set(queue.in_progress_key(exec_id), b"1", px=MINUTE_MS)  # w1's arq lease on the job
    channels = listen(WAKE, keys.events(exec_id))
    assert reap(r, exec_id, "w1")[0] == "requeued"
    assert state(r, exec_id)["state"] == "queued"
    assert not r.exists(queue.in_progress_key(exec_id))  # another worker may take the job now
    assert not r.sismember(keys.running("w1"), exec_id)
    assert not r.exists(keys.record(exec_id))
    assert in_zset(r, keys.PENDING, exec_id)
    assert received(channels) == [(WAKE, b"")]
    assert claim(r, exec_id, "w2") == ("run", 2)


def test_reap_settles_a_non_idempotent_execution_uncertain(r: redis.Redis, listen: Any) -> None:
    exec_id = running(r)
    r.set(queue.in_progress_key(exec_id), b"1", px=MINUTE_MS)
    wake, events = listen(WAKE), listen(keys.events(exec_id))
    outcome, stored = reap(r, exec_id, "w1")
    assert outcome == "uncertain"
    assert r.get(keys.record(exec_id)) == stored
    record = record_decoder.decode(stored)
    assert (record.status_code, record.error_code) == (409, "EXECUTION_UNCERTAIN")
    h = state(r, exec_id)
    assert (h["state"], h["attempt"]) == ("done", "2")
    assert not r.exists(queue.in_progress_key(exec_id))
    assert not in_zset(r, keys.PENDING, exec_id)
    assert not r.sismember(keys.running("w1"), exec_id)
    assert event_names(events) == ["final"]
    assert received(wake) == [(WAKE, b"")]
    # The dead worker's late outcome is fenced out, and the re-delivered job never runs.
    assert settle(r, exec_id, 1, done_record(exec_id)) == 0
    assert r.get(keys.record(exec_id)) == stored
    assert claim(r, exec_id, "w2") == ("settled", 0)


def test_reap_of_an_execution_that_moved_on_writes_nothing(r: redis.Redis) -> None:
    exec_id = running(r, idempotent=True)
    assert claim(r, exec_id, "w2") == ("run", 2)  # arq re-delivered it to w2
    r.set(queue.in_progress_key(exec_id), b"1", px=MINUTE_MS)  # w2's lease
    before = state(r, exec_id)
    assert reap(r, exec_id, "w1")[0] == "moved"
    assert state(r, exec_id) == before
    assert r.exists(queue.in_progress_key(exec_id))
    assert not r.exists(keys.record(exec_id))
    assert r.sismember(keys.running("w2"), exec_id)
    assert not r.sismember(keys.running("w1"), exec_id)  # the stale entry is dropped


def test_reap_of_a_settled_execution_only_drops_the_stale_entry(r: redis.Redis) -> None:
    exec_id = running(r)
    record = done_record(exec_id)
    stored, _ = records.final_event(record)
    # Settled through another worker's set: w1's entry was left behind.
    assert settle(r, exec_id, 1, record, worker_id="other") == 1
    assert r.sismember(keys.running("w1"), exec_id)
    assert reap(r, exec_id, "w1")[0] == "settled"
    assert r.get(keys.record(exec_id)) == stored
    assert not r.sismember(keys.running("w1"), exec_id)


# --- EXPIRE_UNSTARTED ------------------------------------------------------------------------


def test_expire_unstarted_settles_an_execution_past_its_start_deadline(r: redis.Redis, listen: Any) -> None:
    exec_id = new_id()
    submit(r, exec_id, queue_wait_ms=-1)
    events = listen(keys.events(exec_id))
    outcome, stored = expire(r, exec_id)
    assert outcome == 1
    assert r.get(keys.record(exec_id)) == stored
    record = record_decoder.decode(stored)
    assert (record.status_code, record.status, record.error_code) == (504, "timed_out", "TIMEOUT")
    assert "never ran" in record.body.decode()
    h = state(r, exec_id)
    assert (h["state"], h["attempt"]) == ("done", "1")
    assert not in_zset(r, keys.QUEUED, exec_id)
    assert not in_zset(r, keys.PENDING, exec_id)
    assert event_names(events) == ["final"]
    assert claim(r, exec_id) == ("settled", 0)


def test_expire_unstarted_leaves_an_execution_not_yet_due(r: redis.Redis) -> None:
    exec_id = new_id()
    submit(r, exec_id)
    assert expire(r, exec_id)[0] == 0
    assert in_zset(r, keys.QUEUED, exec_id)
    assert in_zset(r, keys.PENDING, exec_id)
    assert not r.exists(keys.record(exec_id))
    assert state(r, exec_id)["state"] == "queued"
    assert claim(r, exec_id) == ("run", 1)


def test_expire_unstarted_only_unlists_a_running_execution(r: redis.Redis) -> None:
    exec_id = running(r)
    r.zadd(keys.QUEUED, {exec_id: 0})  # a stale entry, read before the claim removed it
    assert expire(r, exec_id)[0] == 0
    assert not in_zset(r, keys.QUEUED, exec_id)
    assert not r.exists(keys.record(exec_id))
    assert state(r, exec_id)["state"] == "running"


# --- Janitor (JANITOR_SCAN, then REAP and EXPIRE_UNSTARTED) ---------------------------------


async def sweep(redis_server: RedisServer, times: int = 1) -> list[int]:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        janitor = Janitor(client, retention=RETENTION, dead_after=3.0)
        return [await janitor.sweep() for _ in range(times)]
    finally:
        await client.aclose()


async def test_janitor_reaps_only_the_executions_of_dead_workers(r: redis.Redis, redis_server: RedisServer) -> None:
    heartbeat(r, "dead", -10_000)
    heartbeat(r, "alive")
    lost = running(r, worker_id="dead")
    requeued = running(r, idempotent=True, worker_id="dead")
    kept = running(r, worker_id="alive")
    assert await sweep(redis_server) == [2]
    assert record_decoder.decode(r.get(keys.record(lost))).error_code == "EXECUTION_UNCERTAIN"
    assert state(r, requeued)["state"] == "queued" and not r.exists(keys.record(requeued))
    assert state(r, kept)["state"] == "running" and not r.exists(keys.record(kept))
    assert r.sismember(keys.running("alive"), kept)
    assert r.scard(keys.running("dead")) == 0
    assert in_zset(r, keys.WORKERS, "dead")  # recently dead: still remembered


async def test_janitor_forgets_long_departed_workers_once_they_hold_nothing(
    r: redis.Redis, redis_server: RedisServer,
) -> None:
    long_ago = -(DEPARTED_MEMORY_S * 1000 + 1000)
    for worker_id, offset in (("idle", long_ago), ("busy", long_ago), ("recent", -10_000)):
        r.set(keys.worker(worker_id), b"info")
        r.sadd(keys.DRAINING, worker_id)
        heartbeat(r, worker_id, offset)
    held = running(r, worker_id="busy")

    def remembered(worker_id: str) -> tuple[bool, bool, bool]:
        return (bool(r.exists(keys.worker(worker_id))), in_zset(r, keys.WORKERS, worker_id),
                bool(r.sismember(keys.DRAINING, worker_id)))

    assert await sweep(redis_server) == [1]  # the busy worker's execution
    assert remembered("idle") == (False, False, False)
    assert remembered("busy") == (True, True, True)  # it held an execution when scanned
    assert remembered("recent") == (True, True, True)
    assert r.exists(keys.record(held))
    assert await sweep(redis_server) == [0]
    assert remembered("busy") == (False, False, False)
    assert remembered("recent") == (True, True, True)


async def test_janitor_settles_executions_that_never_started_in_time(
    r: redis.Redis, redis_server: RedisServer,
) -> None:
    late, waiting = new_id(), new_id()
    submit(r, late, queue_wait_ms=-1)
    submit(r, waiting)
    assert await sweep(redis_server) == [1]
    assert record_decoder.decode(r.get(keys.record(late))).error_code == "TIMEOUT"
    assert not r.exists(keys.record(waiting))
    assert in_zset(r, keys.QUEUED, waiting)


# --- arq lease (queue._LEASE) ----------------------------------------------------------------


def test_lease_takes_only_due_unleased_jobs_at_most_n_by_redis_clock(r: redis.Redis) -> None:
    lease = r.register_script(queue._LEASE)
    prefix = queue.in_progress_key("")
    now = redis_now_ms(r)
    r.zadd(QUEUE, {"due1": now - 300, "due2": now - 200, "due3": now - 100, "later": now + MINUTE_MS,
                   "taken": now - 400})
    r.set(queue.in_progress_key("taken"), b"other", px=MINUTE_MS)

    def take(n: int) -> list[tuple[str, int]]:
        out = lease(keys=[QUEUE], args=[prefix, n, 5000, 100])
        return [(out[i].decode(), int(float(out[i + 1]))) for i in range(0, len(out), 2)]

    assert take(2) == [("due1", now - 300), ("due2", now - 200)]
    for job_id in ("due1", "due2"):
        assert r.get(queue.in_progress_key(job_id)) == b"1"
        assert 4000 < r.pttl(queue.in_progress_key(job_id)) <= 5000
    assert not r.exists(queue.in_progress_key("due3"), queue.in_progress_key("later"))
    assert r.get(queue.in_progress_key("taken")) == b"other"
    assert r.pttl(queue.in_progress_key("taken")) > 5000
    # The next call takes what is left and due, and nothing twice.
    assert take(5) == [("due3", now - 100)]
    assert take(5) == []
