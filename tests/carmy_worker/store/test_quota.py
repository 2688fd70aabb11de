"""SUBMIT's per-principal quota against the real Redis: the pending limit, the token bucket,
nothing written on a refusal, and the principal's slot freed exactly when the global one is."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from carmy_worker.store import keys
from carmy_worker.store.quota import Quota
from carmy_worker.store.submit import Submission, Submit
from carmy_worker.store.verdicts import Verdicts
from tests.carmy_worker.store.test_scripts import (
    GROUP,
    MINUTE_MS,
    PARTITION,
    PRINCIPAL,
    RETENTION,
    RID,
    claim,
    done_record,
    execution_job,
    new_id,
    redis_now_ms,
    settle,
)

OWNER = keys.owner(PRINCIPAL)
HELD = keys.quota_pending(OWNER, PARTITION)
BUCKET = keys.quota_bucket(OWNER, PARTITION)


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
    exec_id = new_id()
    assert (await submit(ar, exec_id, Quota())).kind == "new"
    assert not r.exists(HELD, BUCKET)
    assert r.hget(keys.execution(exec_id), "quota") is None


async def test_over_the_pending_limit_is_limited_and_writes_nothing(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    quota = Quota(pending=2)
    first, second = new_id(), new_id()
    for exec_id in (first, second):
        assert (await submit(ar, exec_id, quota)).kind == "new"
    before = {k: r.type(k) for k in r.scan_iter()}
    third = new_id()
    refused = await submit(ar, third, quota, request_id=RID)
    assert refused == Submission("limited", pending=2, limit="pending", retry_after_ms=1000)
    assert {k: r.type(k) for k in r.scan_iter()} == before
    assert r.zcard(keys.pending(PARTITION)) == 2 and r.zcard(HELD) == 2
    assert 0 < r.pttl(HELD) <= MINUTE_MS
    # Another principal is not counted against alice's limit.
    assert (await submit(ar, new_id(), quota, principal="bob")).kind == "new"
    # SETTLE frees alice's slot as it frees the global one; the same request id then runs.
    verdict, attempt = await claim(ar, first)
    assert verdict == "run"
    assert await settle(ar, first, attempt, done_record(first))
    assert not r.zscore(HELD, first) and not r.zscore(keys.pending(PARTITION), first)
    assert await submit(ar, third, quota, request_id=RID) == Submission("new", third)


async def test_an_imposed_record_frees_the_principal_slot(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    quota = Quota(pending=1)
    queued = new_id()
    assert (await submit(ar, queued, quota)).kind == "new"
    assert (await submit(ar, new_id(), quota)).kind == "limited"
    assert await Verdicts(ar, retention=RETENTION).cancel(queued, "tally") == "cancelled"
    assert r.zcard(HELD) == 0 and r.zscore(keys.pending(PARTITION), queued) is None
    assert (await submit(ar, new_id(), quota)).kind == "new"


async def test_past_admission_deadlines_are_pruned_as_the_global_ones(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    now = redis_now_ms(r)
    r.zadd(HELD, {"exec_crashed": now - 1})
    r.zadd(keys.pending(PARTITION), {"exec_crashed": now - 1})
    assert (await submit(ar, new_id(), Quota(pending=1))).kind == "new"


async def test_the_bucket_admits_a_burst_then_one_call_per_interval(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    quota = Quota(rate=0.5, burst=3)  # a call every 2 s after 3 at once
    for _ in range(3):
        assert (await submit(ar, new_id(), quota)).kind == "new"
    refused = await submit(ar, new_id(), quota, request_id=RID)
    assert refused.kind == "limited" and refused.limit == "rate"
    assert 1000 < refused.retry_after_ms <= 2000
    assert not r.exists(keys.idempotency(PRINCIPAL, None, RID))
    assert r.zcard(keys.pending(PARTITION)) == 3
    # The bucket's key lives until it is full again (3 calls: about 6 s), no longer.
    assert 4000 < r.pttl(BUCKET) <= 6001
    # A full bucket again, as if the time had passed: the refused request id now runs.
    r.delete(BUCKET)
    assert (await submit(ar, new_id(), quota, request_id=RID)).kind == "new"


async def test_a_quota_refusal_does_not_charge_the_bucket(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    quota = Quota(pending=1, rate=1, burst=5)
    assert (await submit(ar, new_id(), quota)).kind == "new"
    full_at = r.get(BUCKET)
    for _ in range(3):
        assert (await submit(ar, new_id(), quota)).limit == "pending"
    assert (await submit(ar, new_id(), Quota(rate=1, burst=5), max_pending=1)).kind == "full"
    assert r.get(BUCKET) == full_at


async def test_a_retry_of_an_accepted_call_is_never_limited_nor_charged(
    r: redis.Redis, ar: redis.asyncio.Redis,
) -> None:
    quota = Quota(pending=1, rate=0.001, burst=1)
    first = new_id()
    assert (await submit(ar, first, quota, request_id=RID)).kind == "new"
    full_at = r.get(BUCKET)
    # Still running: the retry joins it, over both limits.
    assert await submit(ar, new_id(), quota, request_id=RID) == Submission("join", first)
    verdict, attempt = await claim(ar, first)
    assert verdict == "run"
    assert await settle(ar, first, attempt, done_record(first))
    replay = await submit(ar, new_id(), quota, request_id=RID)
    assert replay.kind == "replay" and replay.record == done_record(first)
    assert r.get(BUCKET) == full_at


async def test_the_quota_set_is_named_in_the_execution_hash(r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    exec_id = new_id()
    assert (await submit(ar, exec_id, Quota(pending=3))).kind == "new"
    assert r.hget(keys.execution(exec_id), "quota") == HELD.encode()
