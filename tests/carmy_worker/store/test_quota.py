"""SUBMIT's per-principal quota against the real Redis: the pending limit, the token bucket,
nothing written on a refusal, and the principal's slot freed exactly when the global one is;
with four partitions, a principal's calls placed in its home partition as the API places them,
so that its quota admits exactly its limit under concurrency."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from carmy_worker.store import keys
from carmy_worker.store.quota import Quota
from carmy_worker.store.submit import Submission, Submit
from carmy_worker.store.verdicts import Verdicts
from tests.carmy_worker.store.test_scripts import (
    GROUP,
    MINUTE_MS,
    PRINCIPAL,
    RETENTION,
    claim,
    done_record,
    execution_job,
    redis_now_ms,
    settle,
)
from tests.cells import cells  # noqa: F401 (a fixture)

OWNER = keys.owner(PRINCIPAL)


def home_id(principal: str = PRINCIPAL) -> str:
    """An execution id of ``principal``'s, as the API draws it with a quota: in its home partition."""
    return keys.new_execution_id(keys.home_partition(keys.owner(principal)))


def held() -> str:
    return keys.quota_pending(OWNER, keys.home_partition(OWNER))


def bucket() -> str:
    return keys.quota_bucket(OWNER, keys.home_partition(OWNER))


def pending() -> str:
    return keys.pending(keys.home_partition(OWNER))


@pytest.fixture
def r(sync_redis: redis.Redis, ar: redis.asyncio.Redis) -> redis.Redis:
    """Observes what the scripts left (``ar``, the store's fixture, emptied Redis first)."""
    return sync_redis


async def submit(ar: redis.asyncio.Redis, exec_id: str, quota: Quota, *, request_id: str | None = None,
                 principal: str = PRINCIPAL, max_pending: int = 100, admission_ms: int = MINUTE_MS) -> Submission:
    job = execution_job(exec_id, request_id=request_id)
    job.principal = principal
    return await Submit(ar, retention=RETENTION)(
        job, group=GROUP, idempotent=False, workers_alive=True, max_pending=max_pending * keys.partition_count(),
        queue_wait_ms=MINUTE_MS, admission_ms=admission_ms, quota=quota,
    )


async def test_no_quota_writes_no_quota_key(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    exec_id = home_id()
    assert (await submit(ar, exec_id, Quota())).kind == "new"
    assert not r.exists(held(), bucket())
    assert r.hget(keys.execution(exec_id), "quota") is None


async def test_over_the_pending_limit_is_limited_and_writes_nothing(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    quota = Quota(pending=2)
    first, second = home_id(), home_id()
    for exec_id in (first, second):
        assert (await submit(ar, exec_id, quota)).kind == "new"
    before = {k: r.type(k) for k in r.scan_iter()}
    third = home_id()
    refused = await submit(ar, third, quota, request_id="rid")
    assert refused == Submission("limited", pending=2, limit="pending", retry_after_ms=1000)
    assert {k: r.type(k) for k in r.scan_iter()} == before
    assert r.zcard(pending()) == 2 and r.zcard(held()) == 2
    assert 0 < r.pttl(held()) <= MINUTE_MS
    # Another principal is not counted against alice's limit.
    assert (await submit(ar, home_id("bob"), quota, principal="bob")).kind == "new"
    # SETTLE frees alice's slot as it frees the global one; the same request id then runs.
    verdict, attempt = await claim(ar, first)
    assert verdict == "run"
    assert await settle(ar, first, attempt, done_record(first))
    assert not r.zscore(held(), first) and not r.zscore(pending(), first)
    assert await submit(ar, third, quota, request_id="rid") == Submission("new", third)


async def test_an_imposed_record_frees_the_principal_slot(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    quota = Quota(pending=1)
    queued = home_id()
    assert (await submit(ar, queued, quota)).kind == "new"
    assert (await submit(ar, home_id(), quota)).kind == "limited"
    assert await Verdicts(ar, retention=RETENTION).cancel(queued, "tally") == "cancelled"
    assert r.zcard(held()) == 0 and r.zscore(pending(), queued) is None
    assert (await submit(ar, home_id(), quota)).kind == "new"


async def test_past_admission_deadlines_are_pruned_as_the_global_ones(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    now = redis_now_ms(r)
    r.zadd(held(), {"exec_crashed": now - 1})
    r.zadd(pending(), {"exec_crashed": now - 1})
    assert (await submit(ar, home_id(), Quota(pending=1))).kind == "new"


async def test_the_bucket_admits_a_burst_then_one_call_per_interval(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    quota = Quota(rate=0.5, burst=3)  # a call every 2 s after 3 at once
    for _ in range(3):
        assert (await submit(ar, home_id(), quota)).kind == "new"
    refused = await submit(ar, home_id(), quota, request_id="rid")
    assert refused.kind == "limited" and refused.limit == "rate"
    assert 1000 < refused.retry_after_ms <= 2000
    assert not r.exists(keys.idempotency(PRINCIPAL, None, "rid", keys.home_partition(OWNER)))
    assert r.zcard(pending()) == 3
    # The bucket's key lives until it is full again (3 calls: about 6 s), no longer.
    assert 4000 < r.pttl(bucket()) <= 6001
    # A full bucket again, as if the time had passed: the refused request id now runs.
    r.delete(bucket())
    assert (await submit(ar, home_id(), quota, request_id="rid")).kind == "new"


async def test_a_quota_refusal_does_not_charge_the_bucket(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    quota = Quota(pending=1, rate=1, burst=5)
    assert (await submit(ar, home_id(), quota)).kind == "new"
    full_at = r.get(bucket())
    for _ in range(3):
        assert (await submit(ar, home_id(), quota)).limit == "pending"
    assert (await submit(ar, home_id(), Quota(rate=1, burst=5), max_pending=1)).kind == "full"
    assert r.get(bucket()) == full_at


async def test_a_retry_of_an_accepted_call_is_never_limited_nor_charged(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    quota = Quota(pending=1, rate=0.001, burst=1)
    first = home_id()
    assert (await submit(ar, first, quota, request_id="rid")).kind == "new"
    full_at = r.get(bucket())
    # Still running: the retry joins it, over both limits.
    assert await submit(ar, home_id(), quota, request_id="rid") == Submission("join", first)
    verdict, attempt = await claim(ar, first)
    assert verdict == "run"
    assert await settle(ar, first, attempt, done_record(first))
    replay = await submit(ar, home_id(), quota, request_id="rid")
    assert replay.kind == "replay" and replay.record == done_record(first)
    assert r.get(bucket()) == full_at


async def test_the_quota_set_is_named_in_the_execution_hash(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    exec_id = home_id()
    assert (await submit(ar, exec_id, Quota(pending=3))).kind == "new"
    assert r.hget(keys.execution(exec_id), "quota") == held().encode()


async def call(ar: redis.asyncio.Redis, quota: Quota, request_id: str | None, principal: str = PRINCIPAL) -> Submission:
    """A call placed as ``api.calling.calls`` places it: in the home partition with a quota."""
    exec_id = keys.new_execution_id(keys.request_partition(principal, None, request_id, homed=quota.bounded))
    return await submit(ar, exec_id, quota, request_id=request_id, principal=principal)


@pytest.mark.usefixtures("cells")
async def test_a_principals_pending_limit_admits_exactly_its_limit_over_partitions(
        r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    quota = Quota(pending=5)
    answers = await asyncio.gather(*(call(ar, quota, f"req-{i}" if i % 2 else None) for i in range(40)))
    assert Counter(a.kind for a in answers) == {"new": 5, "limited": 35}
    admitted = [a.execution_id for a in answers if a.kind == "new"]
    assert {keys.partition_of(xid) for xid in admitted} == {keys.home_partition(OWNER)}
    assert r.zcard(held()) == 5
    # A retry of an admitted request id finds its key (placement depends on nothing else): it joins.
    retried = next(f"req-{i}" for i, a in enumerate(answers) if a.kind == "new" and i % 2)
    assert (await call(ar, quota, retried)).kind == "join"


@pytest.mark.usefixtures("cells")
async def test_a_principals_bucket_admits_exactly_its_burst_over_partitions(
        r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    quota = Quota(rate=0.001, burst=3)
    answers = await asyncio.gather(*(call(ar, quota, f"req-{i}") for i in range(30)))
    assert Counter((a.kind, a.limit) for a in answers) == {("new", ""): 3, ("limited", "rate"): 27}
    assert r.exists(bucket())


@pytest.mark.usefixtures("cells")
def test_a_principal_with_a_quota_has_every_key_of_its_calls_in_its_home_slot() -> None:
    home = keys.home_partition(OWNER)
    for n in range(50):
        request_id = f"req-{n}" if n % 5 else None
        partition = keys.request_partition(PRINCIPAL, "s", request_id, homed=True)
        assert partition == home
        exec_id = keys.new_execution_id(partition)
        names = [keys.execution(exec_id), keys.quota_pending(OWNER, partition), keys.quota_bucket(OWNER, partition)]
        if request_id is not None:
            names.append(keys.idempotency(PRINCIPAL, "s", request_id, partition))
        assert {key_slot(name.encode()) for name in names} == {key_slot(keys.partition_prefix(home).encode())}
    # Without a quota, calls spread over every partition as before.
    spread = {keys.request_partition(PRINCIPAL, "s", f"req-{n}") for n in range(200)}
    assert spread == set(keys.partitions())
