"""The jobs' scripts against a real Redis: CREATE, PROMOTE, SETTLE's listing, CONCLUDE, CANCEL and
RETRY, driven by hand the way the API and a worker's job loop drive them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio

from carmy_worker.sdk.errors import ToolError
from carmy_worker.store import jobs, keys, records
from carmy_worker.store.attempts import Attempts
from carmy_worker.store.joblists import Cursor
from carmy_worker.store.jobstore import JobState, JobStore, job_fields
from carmy_worker.store.promotion import Look, Promotion, Promotions
from carmy_worker.wire import ExecutionJob, RetryPolicy, job_decoder, msgpack_encoder
from tests.cells import cells  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("cells")

GROUP = "g"
OWNER = keys.owner("alice")


def home() -> int:
    """Alice's home partition, where her jobs are (under whatever count the test runs with)."""
    return keys.home_partition(OWNER)


async def create(store: JobStore, *, tool: str = "t", delay_ms: int = 0, request_id: str | None = None,
                 body: str = "a", max_open: int = 0, idempotent: bool = True) -> str:
    template = ExecutionJob(execution_id="", tool=tool, arguments=b"{}", principal="alice")
    fields = job_fields(tool=tool, owner=OWNER, payload=msgpack_encoder.encode(template),
                        policy=RetryPolicy(max_attempts=2, backoff=0.01, max_backoff=0.01), max_attempts=2,
                        idempotent=idempotent, retention=60, dead_retention=120, request_id=request_id)
    created = await store.create(
        job_id=JobStore.new_job_id(OWNER), tool=tool, owner=OWNER, fields=fields,
        idempotency=None if request_id is None else keys.job_idempotency("alice", None, request_id),
        fingerprint=body, run_at_ms=None, delay_ms=delay_ms, horizon_ms=3_600_000, max_open=max_open)
    assert created.kind in ("new", "existing"), created
    return created.job_id


async def promote_due(p: Promotions, ar: redis.asyncio.Redis, tool: str = "t") -> list[str]:
    look = await p.look([tool], GROUP, home(), room=100)
    made = []
    for _, job_id in look.due:
        attempts, payload = await ar.hmget(keys.job(job_id), ["attempts", "payload"])
        exec_id = keys.new_execution_id(home())
        job = msgspec_replace(job_decoder.decode(payload), exec_id)
        made.append(Promotion(job_id, int(attempts), exec_id, jobs.encode_job(msgpack_encoder.encode(job), 0)))
    done = await p.promote(tool, made, home(), group=GROUP, start_window_ms=60_000, admission_ms=60_000, retention=60)
    return [m.execution_id for m in made if m.job_id in done]


def msgspec_replace(job: ExecutionJob, exec_id: str) -> ExecutionJob:
    import msgspec

    return msgspec.structs.replace(job, execution_id=exec_id)


async def run_attempt(ar: redis.asyncio.Redis, exec_id: str, *, fail: ToolError | None = None) -> None:
    """An execution's record, written by SETTLE as for a verdict (no claim: the scripts that claim
    an execution are another part's, and the record is all a job's conclusion reads)."""
    attempts = Attempts(ar, worker_id="w1", retention=60, group=GROUP)
    record = (records.completed(exec_id, "t", b'{"ok":true}', cacheable=False, duration_ms=1) if fail is None
              else records.failed(exec_id, "t", fail.to_wire()))
    assert await attempts.settle(record, exec_id=exec_id, attempt=0, ran=False)


async def state(store: JobStore, job_id: str) -> JobState:
    job = await store.read(job_id)
    assert job is not None
    return job


async def conclude(p: Promotions, store: JobStore, exec_id: str, status: str, delay_ms: int = 0) -> str:
    job_id = (await p.redis.hget(keys.execution(exec_id), "job")).decode()
    job = await state(store, job_id)
    return await p.conclude(job_id=job_id, tool=job.tool, owner=job.owner, idem_key=job.idem_key,
                            execution_id=exec_id, status=status, delay_ms=delay_ms, result=b'{"r":1}')


async def test_a_job_is_promoted_once_settled_listed_and_concluded(ar: redis.asyncio.Redis) -> None:
    store, p = JobStore(ar), Promotions(ar)
    job_id = await create(store)
    assert (await state(store, job_id)).status == "queued"

    first, second = await asyncio.gather(promote_due(p, ar), promote_due(p, ar))
    assert len(first) + len(second) == 1  # two loops at once: one attempt
    exec_id = (first + second)[0]
    job = await state(store, job_id)
    assert (job.status, job.attempts, job.executions) == ("running", 1, [exec_id])
    assert await ar.zscore(jobs.queue_name(GROUP, home()), exec_id) is not None
    assert await ar.hget(keys.execution(exec_id), "owner") == OWNER.encode()

    await run_attempt(ar, exec_id)
    look = await p.look(["t"], GROUP, home(), room=100)
    assert look.settled == [exec_id]
    assert await conclude(p, store, exec_id, "succeeded") == "succeeded"
    assert await conclude(p, store, exec_id, "succeeded") == ""  # a second loop changes nothing
    job = await state(store, job_id)
    assert job.status == "succeeded" and job.result == b'{"r":1}'
    assert await ar.zcard(keys.jobs_settled(home())) == 0
    assert await ar.zscore(keys.jobs_open(OWNER, home()), job_id) is None
    assert 0 < await ar.ttl(keys.job(job_id)) <= 60


async def test_a_retry_is_due_after_its_delay_and_runs_as_a_new_attempt(ar: redis.asyncio.Redis) -> None:
    store, p = JobStore(ar), Promotions(ar)
    job_id = await create(store)
    [exec_id] = await promote_due(p, ar)
    await run_attempt(ar, exec_id, fail=ToolError("BUSY", "later", retryable=True))
    assert await conclude(p, store, exec_id, "queued", delay_ms=60_000) == "queued"
    assert await promote_due(p, ar) == []  # not yet due
    await ar.zadd(keys.job_due("t", home()), {job_id: 0})
    await ar.hset(keys.job(job_id), "due", 0)
    [again] = await promote_due(p, ar)
    job = await state(store, job_id)
    assert job.attempts == 2 and job.executions == [exec_id, again]


async def test_a_request_id_makes_one_job_and_another_body_conflicts(ar: redis.asyncio.Redis) -> None:
    store = JobStore(ar)
    one = await create(store, request_id="r1")
    assert await create(store, request_id="r1") == one
    template = ExecutionJob(execution_id="", tool="t", arguments=b"{}")
    fields = job_fields(tool="t", owner=OWNER, payload=msgpack_encoder.encode(template), policy=RetryPolicy(),
                        max_attempts=1, idempotent=True, retention=60, dead_retention=60, request_id="r1")
    other = await store.create(job_id=JobStore.new_job_id(OWNER), tool="t", owner=OWNER, fields=fields,
                               idempotency=keys.job_idempotency("alice", None, "r1"), fingerprint="b",
                               run_at_ms=None, delay_ms=0, horizon_ms=1000, max_open=0)
    assert (other.kind, other.job_id) == ("conflict", one)


async def test_limits_refuse_with_nothing_written(ar: redis.asyncio.Redis) -> None:
    store = JobStore(ar)
    await create(store, max_open=1)
    template = ExecutionJob(execution_id="", tool="t", arguments=b"{}")
    fields = job_fields(tool="t", owner=OWNER, payload=msgpack_encoder.encode(template), policy=RetryPolicy(),
                        max_attempts=1, idempotent=True, retention=60, dead_retention=60, request_id=None)
    for kwargs, kind in (({"max_open": 1}, "limited"), ({"max_open": 0, "delay_ms": 10_000}, "too_far")):
        job_id = JobStore.new_job_id(OWNER)
        created = await store.create(job_id=job_id, tool="t", owner=OWNER, fields=fields, idempotency=None,
                                     fingerprint="", run_at_ms=None, horizon_ms=1000,
                                     **{"delay_ms": 0, **kwargs})  # type: ignore[arg-type]
        assert created.kind == kind
        assert not await ar.exists(keys.job(job_id))


async def test_cancel_of_a_queued_job_takes_it_out_of_the_due_set(ar: redis.asyncio.Redis) -> None:
    store, p = JobStore(ar), Promotions(ar)
    job_id = await create(store, delay_ms=1000)
    assert await store.cancel(await state(store, job_id)) == ("cancelled", None)
    assert await ar.zscore(keys.job_due("t", home()), job_id) is None
    assert (await state(store, job_id)).status == "cancelled"
    assert await promote_due(p, ar) == []


async def test_cancel_of_a_running_job_ends_it_cancelled_not_queued_again(ar: redis.asyncio.Redis) -> None:
    store, p = JobStore(ar), Promotions(ar)
    job_id = await create(store)
    [exec_id] = await promote_due(p, ar)
    assert await store.cancel(await state(store, job_id)) == ("running", exec_id)
    await run_attempt(ar, exec_id, fail=ToolError("BUSY", "later", retryable=True))
    assert await conclude(p, store, exec_id, "queued", delay_ms=10) == "cancelled"
    assert await ar.zscore(keys.job_due("t", home()), job_id) is None


async def test_an_operator_retry_requeues_a_dead_letter(ar: redis.asyncio.Redis) -> None:
    store, p = JobStore(ar), Promotions(ar)
    job_id = await create(store, request_id="dl")
    [exec_id] = await promote_due(p, ar)
    await run_attempt(ar, exec_id, fail=ToolError("BUSY", "later", retryable=True))
    assert await conclude(p, store, exec_id, "dead_lettered") == "dead_lettered"
    assert await ar.zscore(keys.jobs_dead(home()), job_id) is not None
    assert await ar.ttl(keys.job(job_id)) > 60  # a dead letter keeps its own, longer retention
    assert await store.retry(await state(store, job_id)) == "retried"
    job = await state(store, job_id)
    assert (job.status, job.attempts_left) == ("queued", 2)
    assert await ar.ttl(keys.job(job_id)) == -1 and await ar.zscore(keys.jobs_dead(home()), job_id) is None
    assert await ar.ttl(keys.job_idempotency("alice", None, "dl")) == -1
    assert await store.retry(job) == "queued"  # not failed or dead: refused, saying why
    [again] = await promote_due(p, ar)
    assert (await state(store, job_id)).executions == [exec_id, again]


async def test_a_finished_job_leaves_its_lists_once_its_retention_is_over(ar: redis.asyncio.Redis) -> None:
    store, p = JobStore(ar), Promotions(ar)
    job_id = await create(store)
    [exec_id] = await promote_due(p, ar)
    await run_attempt(ar, exec_id, fail=ToolError("BUSY", "later", retryable=True))
    await conclude(p, store, exec_id, "dead_lettered")
    assert await store.forget_expired(home()) == 0  # kept for its retention: still listed
    assert [j.job_id for j in (await store.list(owner=OWNER, status=None, limit=10)).jobs] == [job_id]
    # Its retention runs out: Redis drops the hash, and the sweep the lists' entries.
    await ar.delete(keys.job(job_id))
    await ar.zadd(keys.jobs_expiring(home()), {f"{job_id} {OWNER}": 0})
    assert await store.forget_expired(home()) == 1
    p = home()
    for listing in (keys.jobs_all(p), keys.jobs_of(OWNER, p), keys.jobs_dead(p), keys.jobs_expiring(p)):
        assert await ar.zcard(listing) == 0, listing


async def test_what_one_loop_looked_at_is_leased_to_it_until_its_lease_ends(ar: redis.asyncio.Redis) -> None:
    store, p = JobStore(ar), Promotions(ar)
    job_ids = {await create(store) for _ in range(4)}
    first = await p.look(["t"], GROUP, home(), room=100)
    assert {job_id for _, job_id in first.due} == job_ids
    assert (await p.look(["t"], GROUP, home(), room=100)).due == []  # another loop: nothing for it
    await ar.zadd(keys.jobs_settled(home()), {"exec_a": 0, "exec_b": 0})
    mine = await p.look([], GROUP, home(), room=0, settled_at_most=1)
    theirs = await p.look([], GROUP, home(), room=0, settled_at_most=5)
    assert len(mine.settled) == len(theirs.settled) == 1 and mine.settled != theirs.settled

    # A loop that died with them leased: once the lease is over, another loop sees them.
    await ar.zadd(keys.job_due("t", home()), dict.fromkeys(job_ids, 0), xx=True)
    leased = await p.look(["t"], GROUP, home(), room=100, due_lease_ms=1)
    assert {job_id for _, job_id in leased.due} == job_ids
    again = await turns_until_async(lambda: p.look(["t"], GROUP, home(), room=100), lambda look: look.due)
    assert {job_id for _, job_id in again.due} == job_ids


async def turns_until_async(look: Callable[[], Awaitable[Look]], done: Callable[[Look], object]) -> Look:
    """``look()`` again until ``done`` says what it found will do (a lease of 1 ms ends soon)."""
    for _ in range(1000):
        found = await look()
        if done(found):
            return found
        await asyncio.sleep(0.001)
    raise AssertionError("the lease never ended")


async def test_the_operators_list_pages_across_partitions_without_duplicates_or_gaps(
        ar: redis.asyncio.Redis) -> None:
    store = JobStore(ar)
    for n in range(24):
        principal = f"agent-{n % 12}"
        owner = keys.owner(principal)
        fields = job_fields(tool="t", owner=owner, payload=b"", policy=RetryPolicy(), max_attempts=1, idempotent=True,
                            retention=60, dead_retention=60, request_id=None)
        created = await store.create(job_id=JobStore.new_job_id(owner), tool="t", owner=owner, fields=fields,
                                     idempotency=None, fingerprint="", run_at_ms=None, delay_ms=0, horizon_ms=1000,
                                     max_open=0)
        assert created.kind == "new"
    listed = {p: await ar.zrange(keys.jobs_all(p), 0, -1, withscores=True) for p in keys.partitions()}
    assert sum(len(rows) > 0 for rows in listed.values()) > 1 or keys.partition_count() == 1  # merged from several
    # Ties over partitions (jobs created in the same µs): a few share one score.
    tied = [rows[0][0] for rows in listed.values()]
    for p, rows in listed.items():
        await ar.zadd(keys.jobs_all(p), {rows[0][0]: 1})
    expected = sorted(((1 if raw in tied else int(score), raw.decode()) for rows in listed.values()
                       for raw, score in rows), reverse=True)

    pages, after = [], None
    while True:
        page = await store.list(owner=None, status=None, limit=5, after=after)
        pages.append([job.job_id for job in page.jobs])
        if page.after is None:
            break
        after = Cursor.parse(page.after.text())  # as a client sends it back
    assert [job_id for ids in pages for job_id in ids] == [job_id for _, job_id in expected]
    assert all(len(ids) == 5 for ids in pages[:4])


async def test_a_list_pages_through_more_ties_than_a_page_holds(ar: redis.asyncio.Redis) -> None:
    store = JobStore(ar)
    created = {await create(store) for _ in range(120)}
    await ar.zadd(keys.jobs_all(home()), dict.fromkeys(created, 7))  # all created in one µs, as it were
    seen: list[str] = []
    page = await store.list(owner=None, status=None, limit=30)
    while True:
        seen += [job.job_id for job in page.jobs]
        if page.after is None:
            break
        page = await store.list(owner=None, status=None, limit=30, after=page.after)
    assert seen == sorted(created, reverse=True)  # ties in Redis's order: ids descending


def test_a_cursor_is_read_back_only_from_what_a_page_wrote() -> None:
    cursor = Cursor(1_733_000_000_000_000, keys.new_job_id(0))
    assert Cursor.parse(cursor.text()) == cursor
    for text in ("", "12", f"x:{cursor.job_id}", "12:job_nope", f"-1:{cursor.job_id}", f"{'9' * 21}:{cursor.job_id}"):
        assert Cursor.parse(text) is None, text
