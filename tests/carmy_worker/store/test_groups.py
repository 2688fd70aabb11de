"""A group no worker serves any more (store/groups.py): the janitor takes out of its queue, in
every partition, what no worker could run, settles what is still queued there (no worker will take
it), then drops its wake list and forgets it; nothing while one of its workers beats.

"An hour ago" is a heartbeat's offset, and "a minute on" a janitor that forgets sooner: no test
waits for either."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio

from carmy_worker.store import jobs, keys
from carmy_worker.store.groups import RECHECK_S, Groups
from carmy_worker.store.janitor import DEPARTED_MEMORY_S, Janitor
from carmy_worker.store.roster import Liveness
from carmy_worker.wire import record_decoder
from tests.carmy_worker.store.test_scripts import GROUP, RETENTION, cancel, redis_now_ms, submit
from tests.cells import cells  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("cells")

DEAD_AFTER = 3.0
HOUR_MS = DEPARTED_MEMORY_S * 1000
LONG_AGO_MS = -(HOUR_MS + 1000)  # a heartbeat's offset: sent more than an hour ago


@pytest.fixture
def r(sync_redis: redis.Redis, ar: redis.asyncio.Redis) -> redis.Redis:
    """Observes what the scripts left (``ar``, the store's fixture, emptied Redis first)."""
    return sync_redis


def janitor(ar: redis.asyncio.Redis, memory: float = DEPARTED_MEMORY_S) -> Janitor:
    return Janitor(ar, retention=RETENTION, dead_after=DEAD_AFTER, memory=memory)


async def beat(ar: redis.asyncio.Redis, worker_id: str, offset_ms: int = 0) -> None:
    """A heartbeat of a worker of GROUP, in every partition."""
    await Liveness(ar, dead_after=DEAD_AFTER, group=GROUP).heartbeat(worker_id, offset_ms=offset_ms)


def queue(partition: int) -> str:
    return jobs.queue_name(GROUP, partition)


def wake(partition: int) -> str:
    return jobs.wake_list(queue(partition))


def entries(r: redis.Redis, partition: int) -> list[str]:
    return [e.decode() for e in r.zrange(queue(partition), 0, -1)]


def error_code(r: redis.Redis, exec_id: str) -> str | None:
    raw = r.get(keys.record(exec_id))
    return None if raw is None else record_decoder.decode(raw).error_code


async def queued(ar: redis.asyncio.Redis, partition: int) -> str:
    exec_id = keys.new_execution_id(partition)
    await submit(ar, exec_id)
    return exec_id


async def test_a_gone_groups_settled_entries_leave_its_queues_and_its_wake_lists_go(
        r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    """Two calls queued to a group whose last worker beat an hour ago: one cancelled, one past its
    start-by. CANCEL and EXPIRE_UNSTARTED leave their entries for a claim that never comes; the
    janitor's sweep settles the late one and, the group gone, takes both out and drops the wake
    list in every partition. The records stay, for their retention."""
    await beat(ar, "w-old", LONG_AGO_MS)
    settled = []
    for p in keys.partitions():
        cancelled, late = await queued(ar, p), await queued(ar, p)
        assert (await cancel(ar, cancelled))[0] == "cancelled"
        r.zadd(keys.queued(p), {late: 0})  # its start-by long past
        r.hset(keys.execution(late), "start_by", 0)
        settled += [cancelled, late]
        assert set(entries(r, p)) == {cancelled, late} and r.llen(wake(p)) == 2

    await janitor(ar).sweep()
    assert [error_code(r, e) for e in settled] == ["CANCELLED", "TIMEOUT"] * keys.partition_count()
    for p in keys.partitions():
        assert not r.exists(queue(p), wake(p))
        assert r.zscore(keys.groups(p), GROUP) is None


async def test_an_execution_still_queued_in_a_gone_group_is_settled_and_goes_a_minute_on(
        r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    """Of a gone group's queue, what a claim would drop goes at once (a settled execution, one
    whose hash expired). One still queued (put back when its worker died, REAP: no start-by holds
    it any more) has no worker left to take it: it is settled TIMEOUT, safe to run again, so that
    its caller or job is answered rather than left waiting for its retention. Its entry goes when
    the group is looked at again, a minute on (not at every sweep), and the group with it."""
    await beat(ar, "w-old", LONG_AGO_MS)
    stranded = {}
    for p in keys.partitions():
        cancelled, expired, stranded[p] = await queued(ar, p), await queued(ar, p), await queued(ar, p)
        await cancel(ar, cancelled)
        r.delete(keys.execution(expired))  # its retention over: Redis no longer knows it
        r.zrem(keys.queued(p), stranded[p])  # requeued by REAP: in no start-by set
        r.hset(keys.execution(stranded[p]), mapping={"attempt": 1, "reaped": 1})

    now = redis_now_ms(r)
    await janitor(ar).sweep()
    for p in keys.partitions():
        assert error_code(r, stranded[p]) == "TIMEOUT"
        record = record_decoder.decode(r.get(keys.record(stranded[p])))
        assert b"no worker serves any more" in record.body
        assert b'"next_actions":[{"action":"retry"' in record.body  # safe to run again
        assert entries(r, p) == [stranded[p]]  # settled now; taken out at the next look
        mark = r.zscore(keys.groups(p), GROUP)
        assert mark is not None and now - HOUR_MS + RECHECK_S * 1000 <= mark < now - HOUR_MS + (RECHECK_S + 5) * 1000

    await janitor(ar).sweep()  # looked at again only a minute on
    assert all(entries(r, p) == [stranded[p]] for p in keys.partitions())
    await janitor(ar, memory=RECHECK_S - 1).sweep()  # a minute on, as far as the marks go
    for p in keys.partitions():
        assert not r.exists(queue(p), wake(p))
        assert r.zscore(keys.groups(p), GROUP) is None


async def test_a_group_whose_worker_beats_again_keeps_what_its_queues_hold(
        r: redis.Redis, ar: redis.asyncio.Redis) -> None:
    """A group found gone, then one of its workers beats again before the janitor gets to it:
    nothing is taken out (its worker's claims will), and the group is no longer gone."""
    await beat(ar, "w-old", LONG_AGO_MS)
    for p in keys.partitions():
        await cancel(ar, await queued(ar, p))
    found = await janitor(ar).scan()
    assert sorted(g.partition for g in found.gone if g.group == GROUP) == list(keys.partitions())

    await beat(ar, "w-back")
    for gone in found.gone:
        assert await Groups(ar, memory_ms=HOUR_MS).forget(gone.group, gone.partition, gone.mark) == (False, [])
    await janitor(ar).sweep()
    now = redis_now_ms(r)
    for p in keys.partitions():
        assert len(entries(r, p)) == 1 and r.llen(wake(p)) == 1
        assert (r.zscore(keys.groups(p), GROUP) or 0) > now - 5000

