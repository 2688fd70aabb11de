"""The jobs' scripts against a real Redis: CREATE, PROMOTE, SETTLE's listing, CONCLUDE, CANCEL and
RETRY, driven by hand the way the API and a worker's job loop drive them."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio

from carmy_worker.sdk.errors import ToolError
from carmy_worker.store import jobs, keys, records
from carmy_worker.store.attempts import Attempts
from carmy_worker.store.joblists import Cursor
from carmy_worker.store.jobstore import JobState, JobStore, job_fields
from carmy_worker.store.promotion import Look, Promotion, Promotions
from carmy_worker.store.quota import NO_QUOTA, Quota
from carmy_worker.wire import ExecutionJob, RetryPolicy, job_decoder, msgpack_encoder
from tests.cells import cells  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("cells")

GROUP = "g"
OWNER = keys.owner("alice")
QUOTA = Quota(pending=100)  # alice's: a quota keeps her jobs in her home partition (the spread's tests below)


def home() -> int:
    """Alice's home partition, where her jobs are (under whatever count the test runs with)."""
    return keys.home_partition(OWNER)


async def create(store: JobStore, *, tool: str = "t", delay_ms: int = 0, request_id: str | None = None,
                 body: str = "a", max_open: int = 0, idempotent: bool = True) -> str:
    template = ExecutionJob(execution_id="", tool=tool, arguments=b"{}", principal="alice")
    fields = job_fields(tool=tool, owner=OWNER, payload=msgpack_encoder.encode(template),
                        policy=RetryPolicy(max_attempts=2, backoff=0.01, max_backoff=0.01), max_attempts=2,
                        idempotent=idempotent, retention=60, dead_retention=120, request_id=request_id)
    idempotency = None if request_id is None else keys.job_idempotency("alice", None, request_id, homed=True)
    created = await store.create(
        job_id=JobStore.new_job_id(OWNER, QUOTA, idempotency), tool=tool, owner=OWNER, fields=fields,
        idempotency=idempotency, fingerprint=body, run_at_ms=None, delay_ms=delay_ms, horizon_ms=3_600_000,
        max_open=max_open, quota=QUOTA)
    assert created.kind in ("new", "existing"), created
    return created.job_id


async def promote_due(p: Promotions, ar: redis.asyncio.Redis, tool: str = "t", loop_id: str = "one") -> list[str]:
    look = await p.look([tool], GROUP, home(), room=100, loop_id=loop_id, number=1)
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

    first, second = await asyncio.gather(promote_due(p, ar), promote_due(p, ar, loop_id="two"))
    assert len(first) + len(second) == 1  # two loops at once: one attempt
    exec_id = (first + second)[0]
    job = await state(store, job_id)
    assert (job.status, job.attempts, job.executions) == ("running", 1, [exec_id])
    assert await ar.zscore(jobs.queue_name(GROUP, home()), exec_id) is not None
    assert await ar.hget(keys.execution(exec_id), "owner") == OWNER.encode()

    await run_attempt(ar, exec_id)
    look = await p.look(["t"], GROUP, home(), room=100, loop_id="one", number=1)
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
    idempotency = keys.job_idempotency("alice", None, "r1", homed=True)
    other = await store.create(job_id=JobStore.new_job_id(OWNER, QUOTA, idempotency), tool="t", owner=OWNER,
                               fields=fields, idempotency=idempotency, fingerprint="b", run_at_ms=None, delay_ms=0,
                               horizon_ms=1000, max_open=0, quota=QUOTA)
    assert (other.kind, other.job_id) == ("conflict", one)


async def test_limits_refuse_with_nothing_written(ar: redis.asyncio.Redis) -> None:
    store = JobStore(ar)
    await create(store, max_open=1)
    template = ExecutionJob(execution_id="", tool="t", arguments=b"{}")
    fields = job_fields(tool="t", owner=OWNER, payload=msgpack_encoder.encode(template), policy=RetryPolicy(),
                        max_attempts=1, idempotent=True, retention=60, dead_retention=60, request_id=None)
    for kwargs, kind in (({"max_open": 1}, "limited"), ({"max_open": 0, "delay_ms": 10_000}, "too_far")):
        job_id = JobStore.new_job_id(OWNER, QUOTA)
        created = await store.create(job_id=job_id, tool="t", owner=OWNER, fields=fields, idempotency=None,
                                     fingerprint="", run_at_ms=None, horizon_ms=1000, quota=QUOTA,
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
    assert await ar.ttl(keys.job_idempotency("alice", None, "dl", homed=True)) == -1
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
    first = await p.look(["t"], GROUP, home(), room=100, loop_id="one", number=1)
    assert {job_id for _, job_id in first.due} == job_ids
    assert (await p.look(["t"], GROUP, home(), room=100, loop_id="two", number=1)).due == []  # another loop: none
    # The first loop, having read that reply: nothing more for it either.
    assert (await p.look(["t"], GROUP, home(), room=100, loop_id="one", number=2, read=1)).due == []
    await ar.zadd(keys.jobs_settled(home()), {"exec_a": 0, "exec_b": 0})
    mine = await p.look([], GROUP, home(), room=0, settled_at_most=1, loop_id="three", number=1)
    theirs = await p.look([], GROUP, home(), room=0, settled_at_most=5, loop_id="four", number=1)
    assert len(mine.settled) == len(theirs.settled) == 1 and mine.settled != theirs.settled

    # A loop that died with them leased: once the lease is over, another loop sees them.
    await ar.zadd(keys.job_due("t", home()), dict.fromkeys(job_ids, 0), xx=True)
    leased = await p.look(["t"], GROUP, home(), room=100, due_lease_ms=1, loop_id="five", number=1)
    assert {job_id for _, job_id in leased.due} == job_ids
    again = await turns_until_async(lambda: p.look(["t"], GROUP, home(), room=100, loop_id="six", number=1),
                                    lambda look: look.due)
    assert {job_id for _, job_id in again.due} == job_ids


async def test_a_loop_that_never_read_its_looks_reply_gets_its_jobs_again(ar: redis.asyncio.Redis) -> None:
    """A LOOK whose reply is lost (a connection cut as Redis answered) leased its jobs all the
    same: the loop's next LOOK, which names the last reply it did read, gets them again at once,
    rather than after the lease; no other loop does; and once read, they are not handed out twice."""
    store, p = JobStore(ar), Promotions(ar)
    job_ids = {await create(store) for _ in range(3)}
    read = await p.look(["t"], GROUP, home(), room=100, loop_id="one", number=1)  # read
    assert read.due == [] or {job_id for _, job_id in read.due} == job_ids
    await ar.zadd(keys.job_due("t", home()), dict.fromkeys(job_ids, 0), xx=True)
    lost = await p.look(["t"], GROUP, home(), room=100, loop_id="one", number=2, read=1)  # its reply "lost"
    assert {job_id for _, job_id in lost.due} == job_ids
    assert (await p.look(["t"], GROUP, home(), room=100, loop_id="two", number=1)).due == []  # still leased
    again = await p.look(["t"], GROUP, home(), room=100, loop_id="one", number=3, read=1)
    assert {job_id for _, job_id in again.due} == job_ids
    # Handed again whatever the room (it counted them when they were first leased); they take it
    # from anything new.
    assert len((await p.look(["t"], GROUP, home(), room=2, loop_id="one", number=4, read=1)).due) == 3
    await p.look(["t"], GROUP, home(), room=100, loop_id="one", number=5, read=1)
    assert (await p.look(["t"], GROUP, home(), room=100, loop_id="one", number=6, read=5)).due == []
    # A job promoted, or gone from its due set, is not handed again.
    await ar.zadd(keys.job_due("t", home()), dict.fromkeys(job_ids, 0), xx=True)
    lost = await p.look(["t"], GROUP, home(), room=100, loop_id="three", number=1)
    assert {job_id for _, job_id in lost.due} == job_ids
    gone = sorted(job_ids)[0]
    await ar.zrem(keys.job_due("t", home()), gone)
    again = await p.look(["t"], GROUP, home(), room=100, loop_id="three", number=2)
    assert {job_id for _, job_id in again.due} == job_ids - {gone}
    # Its lease over, what it leased is any loop's again (and not handed from the list as well).
    await ar.zadd(keys.job_due("t", home()), dict.fromkeys(job_ids - {gone}, 0), xx=True)
    short = await p.look(["t"], GROUP, home(), room=100, loop_id="four", number=1, due_lease_ms=1)
    assert len(short.due) == 2
    later = await turns_until_async(lambda: p.look(["t"], GROUP, home(), room=100, loop_id="four", number=2),
                                    lambda look: look.due)
    assert sorted(later.due) == sorted(short.due)  # once each: from the due set, not twice


async def turns_until_async(look: Callable[[], Awaitable[Look]], done: Callable[[Look], object]) -> Look:
    """``look()`` again until ``done`` says what it found will do (a lease of 1 ms ends soon)."""
    for _ in range(1000):
        found = await look()
        if done(found):
            return found
        await asyncio.sleep(0.001)
    raise AssertionError("the lease never ended")


async def pages_of(store: JobStore, owner: str | None, *, limit: int,
                   between: Callable[[], Awaitable[object]] | None = None) -> list[list[str]]:
    """The job ids of each page of ``owner``'s list (None: every job), each page after the first
    asked for with the cursor as a client sends it back; ``between`` runs between two pages."""
    pages, after = [], None
    while True:
        page = await store.list(owner=owner, status=None, limit=limit, after=after)
        pages.append([job.job_id for job in page.jobs])
        if page.after is None:
            return pages
        after = Cursor.parse(page.after.text())
        if between is not None:
            await between()


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

    pages = await pages_of(store, None, limit=5)
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


# --- where a principal's jobs are: spread without a quota, home with one ---------------------
ANONYMOUS = keys.owner(None)  # the principal of an API without keys: every job of a single tenant


async def create_as(store: JobStore, principal: str | None, *, request_id: str | None = None,
                    quota: Quota = NO_QUOTA, max_open: int = 0, job_id: str | None = None) -> tuple[str, str]:
    """Create a job as the API does for ``principal`` with ``quota``: (CREATE's answer, the job id)."""
    owner = keys.owner(principal)
    fields = job_fields(tool="t", owner=owner, payload=b"", policy=RetryPolicy(), max_attempts=1, idempotent=True,
                        retention=60, dead_retention=60, request_id=request_id)
    idempotency = None if request_id is None else keys.job_idempotency(principal, None, request_id,
                                                                       homed=quota.bounded)
    created = await store.create(job_id=job_id or JobStore.new_job_id(owner, quota, idempotency), tool="t",
                                 owner=owner, fields=fields, idempotency=idempotency, fingerprint="", run_at_ms=None,
                                 delay_ms=0, horizon_ms=1000, max_open=max_open, quota=quota)
    return created.kind, created.job_id


async def test_an_anonymous_principals_jobs_land_in_every_partition(ar: redis.asyncio.Redis) -> None:
    store = JobStore(ar)
    made = [await create_as(store, None, request_id=None if n % 2 else f"r{n}") for n in range(200)]
    assert {kind for kind, _ in made} == {"new"}
    job_ids = [job_id for _, job_id in made]
    assert {keys.partition_of(job_id) for job_id in job_ids} == set(keys.partitions())
    for n, job_id in enumerate(job_ids):
        p = keys.partition_of(job_id)
        assert await ar.zscore(keys.jobs_of(ANONYMOUS, p), job_id) is not None
        assert await ar.zscore(keys.jobs_open(ANONYMOUS, p), job_id) is not None
        assert await ar.zscore(keys.job_due("t", p), job_id) is not None
        if n % 2 == 0:  # its request id's key is in the job's partition, placed by its digest
            idempotency = keys.job_idempotency(None, None, f"r{n}")
            assert keys.partition_of_key(idempotency) == p
            assert (await ar.get(idempotency) or b"").split()[0].decode() == job_id
    assert {keys.partition_of_key(keys.job_idempotency(None, None, f"r{n}")) for n in range(0, 200, 2)} == set(
        keys.partitions())


async def test_a_retried_job_request_id_finds_its_job(ar: redis.asyncio.Redis) -> None:
    store = JobStore(ar)
    firsts = await asyncio.gather(*(create_as(store, None, request_id=f"again-{n}") for n in range(40)))
    # The same request ids again, twice at once each: each finds its job in its partition.
    again = await asyncio.gather(*(create_as(store, None, request_id=f"again-{n}") for n in range(40) for _ in "ab"))
    assert {kind for kind, _ in firsts} == {"new"} and {kind for kind, _ in again} == {"existing"}
    assert [job_id for _, job_id in again] == [job_id for _, job_id in firsts for _ in "ab"]
    assert len({keys.partition_of(job_id) for _, job_id in firsts}) == min(keys.partition_count(), 4)
    assert sum([await ar.zcard(keys.jobs_of(ANONYMOUS, p)) for p in keys.partitions()]) == 40


@pytest.mark.parametrize("limit", [10, 3])
async def test_the_open_jobs_limit_is_a_share_in_each_partition(ar: redis.asyncio.Redis, limit: int) -> None:
    """Concurrent CREATEs of one principal without a quota: each partition admits exactly its share,
    ceil(limit / N), so at most limit + N - 1 are open; once each partition had its share's worth of
    tries, at least limit are; and one partition can refuse once it holds its share alone."""
    store, count, share = JobStore(ar), keys.partition_count(), keys.share(limit)
    assert share == -(-limit // count)
    tries = [keys.new_job_id(p) for p in keys.partitions() for _ in range(share + 3)]
    random.shuffle(tries)
    made = await asyncio.gather(*(create_as(store, None, max_open=limit, job_id=job_id) for job_id in tries))
    admitted = [job_id for kind, job_id in made if kind == "new"]
    assert {kind for kind, _ in made} == {"new", "limited"}
    for p in keys.partitions():
        assert sum(keys.partition_of(job_id) == p for job_id in admitted) == share
        assert await ar.zcard(keys.jobs_open(ANONYMOUS, p)) == share
    assert limit <= len(admitted) == count * share <= limit + count - 1
    # Refused early: every try in one partition, which holds its share while the others hold none.
    await ar.delete(*(keys.jobs_open(ANONYMOUS, p) for p in keys.partitions()))
    last = keys.partition_count() - 1
    made = await asyncio.gather(*(create_as(store, None, max_open=limit, job_id=keys.new_job_id(last))
                                  for _ in range(limit + 2)))
    assert sum(kind == "new" for kind, _ in made) == share
    refused = await create_as(store, None, max_open=limit, job_id=keys.new_job_id(last))
    assert refused[0] == "limited"


async def test_a_principal_with_a_quota_keeps_its_jobs_home_and_its_limit_exact(ar: redis.asyncio.Redis) -> None:
    store, quota, owner = JobStore(ar), Quota(pending=5), keys.owner("bob")
    home = keys.home_partition(owner)
    made = await asyncio.gather(*(create_as(store, "bob", quota=quota, max_open=10,
                                            request_id=f"b{n}" if n % 2 else None) for n in range(30)))
    admitted = [job_id for kind, job_id in made if kind == "new"]
    assert len(admitted) == 10 and {kind for kind, _ in made} == {"new", "limited"}
    assert {keys.partition_of(job_id) for job_id in admitted} == {home}
    assert await ar.zcard(keys.jobs_open(owner, home)) == 10
    assert {keys.partition_of_key(keys.job_idempotency("bob", None, f"b{n}", homed=True)) for n in range(30)} == {home}
    assert sorted(job.job_id for job in (await store.list(owner=owner, status=None, limit=50)).jobs) == sorted(admitted)
    if keys.partition_count() > 1:  # a job drawn elsewhere would be counted apart from the others
        elsewhere = keys.new_job_id((home + 1) % keys.partition_count())
        with pytest.raises(ValueError, match="partition"):
            await create_as(store, "bob", quota=quota, job_id=elsewhere)
        with pytest.raises(ValueError, match="home partition"):  # a request id's key placed by its digest
            await store.create(job_id=keys.new_job_id(home), tool="t", owner=owner, fields=[], fingerprint="",
                               idempotency=next(key for n in range(100) if keys.partition_of_key(
                                   key := keys.job_idempotency("bob", None, f"d{n}")) != home),
                               run_at_ms=None, delay_ms=0, horizon_ms=1000, max_open=0, quota=quota)


async def test_a_principals_list_pages_across_partitions_without_duplicates_or_gaps(
        ar: redis.asyncio.Redis) -> None:
    store = JobStore(ar)
    mine = {(await create_as(store, None, request_id=None if n % 3 else f"l{n}"))[1] for n in range(45)}
    for n in range(15):  # others' jobs, in the same partitions: not in the list
        await create_as(store, f"other-{n}")
    listed = {p: await ar.zrange(keys.jobs_of(ANONYMOUS, p), 0, -1, withscores=True) for p in keys.partitions()}
    assert sum(len(rows) > 0 for rows in listed.values()) == keys.partition_count()  # merged from every one
    # Ties over partitions (jobs created in the same µs): each partition's newest moves to one score.
    tied = [rows[-1][0] for rows in listed.values()]
    for p, rows in listed.items():
        await ar.zadd(keys.jobs_of(ANONYMOUS, p), {rows[-1][0]: 1})
    expected = sorted(((1 if raw in tied else int(score), raw.decode()) for rows in listed.values()
                       for raw, score in rows), reverse=True)
    assert {job_id for _, job_id in expected} == mine

    # A job created between two pages is newer than the cursor: in no later page.
    pages = await pages_of(store, ANONYMOUS, limit=7, between=lambda: create_as(store, None))
    assert [job_id for ids in pages for job_id in ids] == [job_id for _, job_id in expected]
    assert all(len(ids) == 7 for ids in pages[:6])
