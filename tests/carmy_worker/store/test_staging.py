"""Large values kept out of Lua (``store.staging``): a large job's SUBMIT and a large record's
SETTLE. The value is written to a staged key by a plain SET just ahead, and the script renames
it, so that its bytes never cross into Lua; every other answer drops the staged key, and a staged
key gone before the script ran sends the value inline."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import msgspec
import pytest
import redis
import redis.asyncio

from carmy_worker.store import jobs, keys, records
from carmy_worker.store.attempts import Attempts
from carmy_worker.store.durable import Durability
from carmy_worker.store.staging import STAGE_BYTES
from carmy_worker.store.submit import Submission, Submit
from carmy_worker.wire import ExecutionJob, Record, final_event, msgpack_encoder
from tests.support import private_redis

RETENTION = 600
GROUP = "g"
PARTITION = 0
BIG = b'{"blob":"' + b"x" * STAGE_BYTES + b'"}'
QUEUE = jobs.queue_name(GROUP, PARTITION)


@pytest.fixture
def server() -> Iterator[Any]:
    """A Redis of its own: its SLOWLOG shows what every command was sent."""
    with private_redis() as server:
        yield server


@pytest.fixture
def r(server: Any) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    yield client
    client.close()


@pytest.fixture
async def ar(server: Any) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(server.url)
    yield client
    await client.aclose()


def job(arguments: bytes = BIG, request_id: str | None = None) -> ExecutionJob:
    return ExecutionJob(execution_id=keys.new_execution_id(PARTITION), tool="echo", arguments=arguments,
                        request_id=request_id)


async def submit(client: Submit, j: ExecutionJob, *, workers_alive: bool = True, max_pending: int = 10) -> Submission:
    return await client(j, group=GROUP, idempotent=False, workers_alive=workers_alive,
                        max_pending=max_pending * keys.partition_count(), queue_wait_ms=60_000, admission_ms=60_000)


def staged_keys(r: redis.Redis) -> list[bytes]:
    return list(r.scan_iter(match="*staged*"))


def commands(r: redis.Redis) -> list[list[bytes]]:
    """Every command Redis ran since the SLOWLOG was reset, a script's own among them, oldest
    first (as SLOWLOG keeps them: long arguments cut to 128 bytes, with a note of how many more)."""
    return [entry["command"].split(b" ") for entry in reversed(r.slowlog_get(1000))]


async def test_a_large_job_is_renamed_into_place_and_never_sent_as_a_script_argument(
        r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    r.config_set("slowlog-log-slower-than", 0)
    r.slowlog_reset()
    j = job()
    assert await submit(Submit(ar, retention=RETENTION), j) == Submission("new", j.execution_id)

    stored = r.get(jobs.job_key(j.execution_id))
    assert stored is not None
    decoded = msgspec.msgpack.decode(stored)
    assert stored == jobs.encode_job(msgpack_encoder.encode(j), decoded["et"])  # as an inline SUBMIT writes it
    assert RETENTION - 1 <= r.ttl(jobs.job_key(j.execution_id)) <= RETENTION  # not the staged key's TTL
    assert staged_keys(r) == []
    assert r.zscore(QUEUE, j.execution_id) is not None and r.llen(jobs.wake_list(QUEUE)) == 1
    ran = commands(r)
    sets = [c for c in ran if c[0] == b"SET" and c[1] == jobs.staged_job_key(j.execution_id).encode()]
    scripts = [c for c in ran if c[0] == b"EVALSHA" and len(c) > 14]
    # The job went in the SET (sent again with SUBMIT, once loaded: this Redis never saw it)
    assert sets and all(b"more bytes" in b" ".join(c) for c in sets)
    # and not in SUBMIT (tried once more after the script was loaded: this Redis never saw it)
    assert scripts and all(b"more bytes" not in b" ".join(c) for c in scripts)


async def test_a_small_job_goes_inline(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    r.config_set("slowlog-log-slower-than", 0)
    r.slowlog_reset()
    j = job(b'{"n":1}')
    assert (await submit(Submit(ar, retention=RETENTION), j)).kind == "new"
    assert r.get(jobs.job_key(j.execution_id)) is not None
    assert not [c for c in commands(r) if c[0] == b"SET" and b"staged" in c[1]]  # SUBMIT alone


@pytest.mark.parametrize("refusal", ["full", "no_workers", "join", "conflict"])
async def test_every_refusal_drops_the_staged_job(r: redis.Redis, ar: redis.asyncio.Redis, refusal: str) -> None:
    client = Submit(ar, retention=RETENTION)
    first = job(request_id="rid-1")
    assert (await submit(client, first, max_pending=1)).kind == "new"
    before = sorted(r.keys())
    if refusal == "full":
        again = await submit(client, job(), max_pending=1)
    elif refusal == "no_workers":
        again = await submit(client, job(), workers_alive=False)
    elif refusal == "join":
        again = await submit(client, job(request_id="rid-1"))
    else:
        again = await submit(client, job(BIG + b" ", request_id="rid-1"))
    assert again.kind == refusal
    assert sorted(r.keys()) == before  # the refused call's staged job is gone, and nothing else was written


class Rewired:
    """A Submit's SUBMIT, its ``before`` command (the staged SET) replaced by ``instead``: a
    coroutine function run before the call, given that command."""

    def __init__(self, client: Submit, instead: Callable[[tuple[Any, ...]], Awaitable[None]]) -> None:
        self._runs = client._script
        self._instead = instead
        self.batched = self._runs.batched

    def queue(self, keys: list[Any], args: list[Any], *, sent: Any = None,
              before: tuple[Any, ...] | None = None) -> Any:
        if before is None:
            return self._runs.queue(keys, args, sent=sent)
        return self._then(before, keys, args, sent)

    async def _then(self, before: tuple[Any, ...], keys: list[Any], args: list[Any], sent: Any) -> Any:
        await self._instead(before)
        return await self._runs.queue(keys, args, sent=sent)


async def test_a_staged_job_gone_before_submit_ran_is_sent_inline(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    """As when the staged key outlived its TTL, or a failover or a slot's move lost it."""

    async def lost(_: tuple[Any, ...]) -> None:
        return None

    client = Submit(ar, retention=RETENTION)
    client._script = Rewired(client, lost)  # type: ignore[assignment]
    j = job()
    assert await submit(client, j) == Submission("new", j.execution_id)
    stored = r.get(jobs.job_key(j.execution_id))
    assert stored is not None and msgspec.msgpack.decode(stored)["a"][0] == msgpack_encoder.encode(j)
    assert r.zcard(QUEUE) == 1 and r.llen(jobs.wake_list(QUEUE)) == 1  # queued once
    assert staged_keys(r) == []


async def test_submit_with_a_staged_job_missing_writes_nothing(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    """The script's side of the above: ``unstaged``, and no execution, admission or queue entry."""
    client = Submit(ar, retention=RETENTION)
    j = job()
    exec_id = j.execution_id
    redis_keys = [keys.execution(exec_id), keys.pending(PARTITION), keys.queued(PARTITION), jobs.job_key(exec_id),
                  QUEUE, keys.quota_pending("o", PARTITION), keys.quota_bucket("o", PARTITION),
                  jobs.staged_job_key(exec_id)]
    args = [exec_id, "", "", RETENTION, 10, 60_000, 60_000, 1, "echo", "o", 0, keys.record_prefix(PARTITION),
            jobs.wake_list(QUEUE), "", "", 0, 0, 0, "1", "", "", "http", ""]
    reply = await client._script(redis_keys, args)
    assert [x.decode() for x in reply] == ["unstaged"]
    assert r.keys() == []


async def test_a_full_redis_refuses_a_staged_job_and_keeps_none_of_it(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    """Refused at the staged SET, or (Redis filled between the two) at SUBMIT: ``store_full``,
    and the staged job is not left behind."""

    async def fills_up_after_the_set(command: tuple[Any, ...]) -> None:
        await ar.execute_command(*command)
        r.config_set("maxmemory", 1)

    client = Submit(ar, retention=RETENTION)
    assert (await submit(client, job(b'{"n":1}'))).kind == "new"  # SUBMIT loaded, a first execution in
    before = sorted(r.keys())
    try:
        r.config_set("maxmemory", 1)
        assert (await submit(client, job())).kind == "store_full"  # the SET refused
        r.config_set("maxmemory", 0)
        client._script = Rewired(client, fills_up_after_the_set)  # type: ignore[assignment]
        assert (await submit(client, job())).kind == "store_full"  # SUBMIT refused
    finally:
        r.config_set("maxmemory", 0)
    assert sorted(r.keys()) == before


# --- SETTLE ------------------------------------------------------------------------------------


WORKER = "w1"
LARGE_BODY = b'{"blob":"' + b"r" * STAGE_BYTES + b'"}'


async def claimed(client: Submit, attempts: Attempts) -> str:
    """A new execution, claimed to run by WORKER (attempt 1)."""
    j = job(b'{"n":1}')
    assert (await submit(client, j)).kind == "new"
    assert (await attempts.claim(j.execution_id, max_attempts=3)).verdict == "run"
    return j.execution_id


def large_record(exec_id: str) -> Record:
    return records.completed(exec_id, "echo", LARGE_BODY, cacheable=False, duration_ms=1)


async def test_a_large_record_is_renamed_into_place_and_never_sent_as_a_script_argument(
        r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    client, attempts = Submit(ar, retention=RETENTION), Attempts(ar, worker_id=WORKER, retention=RETENTION)
    exec_id = await claimed(client, attempts)
    r.config_set("slowlog-log-slower-than", 0)
    r.slowlog_reset()
    record = large_record(exec_id)
    assert await attempts.settle(record, exec_id=exec_id, attempt=1) is True

    assert r.get(keys.record(exec_id)) == final_event(record)[0]  # as an inline SETTLE writes it
    assert RETENTION - 1 <= r.ttl(keys.record(exec_id)) <= RETENTION
    assert r.hget(keys.execution(exec_id), "state") == b"done"
    assert staged_keys(r) == []
    ran = commands(r)
    sets = [c for c in ran if c[0] == b"SET" and c[1] == keys.staged_record(exec_id).encode()]
    scripts = [c for c in ran if c[0] == b"EVALSHA" and len(c) > 16]  # SETTLE's, not a script's own commands
    assert sets and all(b"more bytes" in b" ".join(c) for c in sets)
    # Its only large argument is the final event, which carries the result to the caller.
    assert scripts and all(sum(b"more bytes" in a for a in c) <= 1 for c in scripts)
    assert await attempts.settle(record, exec_id=exec_id, attempt=1) is False  # written once
    assert staged_keys(r) == []  # and the refused one's staged record dropped


async def test_a_stale_attempt_s_large_record_is_dropped(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    client, attempts = Submit(ar, retention=RETENTION), Attempts(ar, worker_id=WORKER, retention=RETENTION)
    exec_id = await claimed(client, attempts)
    assert await attempts.settle(large_record(exec_id), exec_id=exec_id, attempt=2) is False
    assert not r.exists(keys.record(exec_id))
    assert staged_keys(r) == []


async def test_a_large_record_settles_on_a_full_redis(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    """SETTLE runs over Redis's maxmemory (accepted work settles: lua.ACCEPTED_WORK), but the
    staged SET does not: SETTLE finds it gone, and the record goes inline."""
    client, attempts = Submit(ar, retention=RETENTION), Attempts(ar, worker_id=WORKER, retention=RETENTION)
    exec_id = await claimed(client, attempts)
    record = large_record(exec_id)
    r.config_set("maxmemory", 1)
    try:
        assert await attempts.settle(record, exec_id=exec_id, attempt=1) is True
    finally:
        r.config_set("maxmemory", 0)
    assert r.get(keys.record(exec_id)) == final_event(record)[0]
    assert staged_keys(r) == []


async def test_a_large_job_and_record_are_staged_when_writes_wait_for_replicas(
        r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    """With ``CARMY_REDIS_WAIT_REPLICAS`` SUBMIT and SETTLE are not batched (each has its own
    round trip and ``WAIT``): the staged SET goes just before each, on its own."""
    durability = Durability(replicas=1, timeout_ms=10)  # this Redis has none: each WAIT goes on without
    client = Submit(ar, retention=RETENTION, durability=durability)
    attempts = Attempts(ar, worker_id=WORKER, retention=RETENTION, durability=durability)
    r.config_set("slowlog-log-slower-than", 0)
    r.slowlog_reset()
    j = job()
    assert await submit(client, j) == Submission("new", j.execution_id)
    assert (await attempts.claim(j.execution_id, max_attempts=3)).verdict == "run"
    record = large_record(j.execution_id)
    assert await attempts.settle(record, exec_id=j.execution_id, attempt=1) is True

    assert msgspec.msgpack.decode(r.get(jobs.job_key(j.execution_id)))["a"][0] == msgpack_encoder.encode(j)
    assert r.get(keys.record(j.execution_id)) == final_event(record)[0]
    assert staged_keys(r) == []
    staged_sets = [c for c in commands(r) if c[0] == b"SET" and b"staged" in c[1]]
    assert len({c[1] for c in staged_sets}) == 2  # the job's and the record's
