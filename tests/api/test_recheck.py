"""The process's recheck of the executions it waits for (``api.events.recheck``): a waiter whose
final event was lost still gets its record, a waiter of a running execution is left alone, and
however many wait, a tick costs one command each in a few round trips, not a read apiece.

The executions waited for are the hub's (``EventHub.waiting``): the first test registers its
waiters through a real hub; the others through ``Expected``, a registry kept as the hub keeps it."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import pytest
import redis.asyncio

from api.calling import executions as executions_module
from api.calling.executions import Executions
from api.events import recheck as recheck_module
from api.events.hub import EventHub
from api.events.mailbox import ENDED, RESYNC, Mailbox
from api.events.recheck import Recheck
from carmy_worker.store import keys, records
from carmy_worker.store.attempts import Attempts
from carmy_worker.store.reads import Reads, chunks
from carmy_worker.store.submit import Submit
from carmy_worker.wire import ExecutionJob, Record
from tests import cells
from tests.support import RedisServer, app_settings

RETENTION = 600
NEVER = 3600.0  # a waiter's tick that never comes: only the recheck can wake it


@pytest.fixture
async def ar(own_redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """A client of the module's own Redis, emptied before and after: the tests leave hundreds
    of executions waiting, and count commands."""
    client = redis.asyncio.Redis.from_url(own_redis_server.url)
    await client.flushall()
    yield client
    await client.flushall()
    await client.aclose()


class Expected(dict[str, set[Mailbox]]):
    """Executions waited for and their mailboxes, registered as ``EventHub.expect`` does."""

    @contextmanager
    def expect(self, exec_id: str) -> Iterator[Mailbox]:
        mailbox = Mailbox()
        self.setdefault(exec_id, set()).add(mailbox)
        try:
            yield mailbox
        finally:
            self[exec_id].discard(mailbox)
            if not self[exec_id]:
                del self[exec_id]


async def submitted(ar: redis.asyncio.Redis, partition: int | None = None) -> str:
    """A new execution, queued; its events go to a channel nobody listens to."""
    exec_id = keys.new_execution_id(partition)
    job = ExecutionJob(execution_id=exec_id, tool="t", arguments=b"{}")
    await Submit(ar, retention=RETENTION)(job, group="g", idempotent=False, workers_alive=True,
                                          max_pending=100_000, queue_wait_ms=60_000, admission_ms=60_000)
    return exec_id


async def settle(ar: redis.asyncio.Redis, exec_id: str) -> Record:
    """Run ``exec_id`` to its end; its final event is published where no waiter hears it."""
    attempts = Attempts(ar, worker_id="w1", retention=RETENTION)
    assert (await attempts.claim(exec_id, max_attempts=3)).verdict == "run"
    record = records.completed(exec_id, "t", b'{"n":1}', cacheable=False, duration_ms=1)
    assert await attempts.settle(record, exec_id=exec_id, attempt=1)
    return record


async def command_calls(ar: redis.asyncio.Redis) -> dict[str, int]:
    stats = await ar.info("commandstats")
    return {name.removeprefix("cmdstat_"): value["calls"] for name, value in stats.items()}


async def test_a_waiter_whose_final_event_was_lost_gets_its_record(
        ar: redis.asyncio.Redis, own_redis_server: RedisServer) -> None:
    listener = redis.asyncio.Redis.from_url(own_redis_server.url)
    hub = EventHub(listener)
    await hub.start()
    executions = Executions(ar, app_settings(retention=RETENTION), waiting=hub.waiting)
    executions.recheck = Recheck(Reads(ar), hub.waiting, every=0.05)
    lost, running = await submitted(ar), await submitted(ar)
    rechecking = asyncio.create_task(executions.recheck.run())
    try:
        with hub.expect(running) as running_box:
            waiting = asyncio.create_task(executions.outcome(running, "t", running_box, tick=NEVER))
            with hub.expect(lost) as lost_box:
                answer = asyncio.create_task(executions.outcome(lost, "t", lost_box, tick=NEVER))
                record = await settle(ar, lost)  # its final event reaches no mailbox: dropped on purpose
                assert await asyncio.wait_for(answer, 5) == record
            assert not waiting.done() and list(hub.waiting) == [running]  # the running one waits on
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        assert not hub.waiting  # a waiter that leaves is forgotten
    finally:
        rechecking.cancel()
        await asyncio.gather(rechecking, return_exceptions=True)
        await hub.close()
        await listener.aclose()


async def test_a_waiter_of_an_execution_redis_lost_is_answered_uncertain(ar: redis.asyncio.Redis) -> None:
    expected = Expected()
    executions = Executions(ar, app_settings(retention=RETENTION), waiting=expected)
    exec_id = await submitted(ar)
    with expected.expect(exec_id) as mailbox:
        answer = asyncio.create_task(executions.outcome(exec_id, "t", mailbox, tick=NEVER))
        await ar.delete(keys.execution(exec_id))
        await executions.recheck.once()
        record = await asyncio.wait_for(answer, 5)
    assert record.error_code == "EXECUTION_UNCERTAIN"


@pytest.mark.parametrize("partitions", [1, 4])
@pytest.mark.slow
async def test_a_tick_costs_one_command_a_waiter_in_a_few_round_trips(
        ar: redis.asyncio.Redis, partitions: int) -> None:
    with cells.partitions(partitions):
        expected = Expected()
        executions = Executions(ar, app_settings(retention=RETENTION), waiting=expected)
        n = 400
        ids = [await submitted(ar, partition=i % partitions) for i in range(n)]
        boxes = [Mailbox() for _ in ids]
        expected.update({e: {box} for e, box in zip(ids, boxes, strict=True)})  # as n expect()s would
        waiters = [asyncio.create_task(executions.outcome(e, "t", box, tick=NEVER))
                   for e, box in zip(ids, boxes, strict=True)]
        await asyncio.sleep(0)
        assert len(expected) == n
        # One tick first, so that STATES is loaded on this Redis whatever ran before (on a fresh
        # one its first EVALSHA is refused NOSCRIPT and sent again after a SCRIPT LOAD).
        await executions.recheck.once()
        await ar.config_resetstat()
        reads_before = (await ar.info("stats"))["total_reads_processed"]
        for _ in range(3):
            await executions.recheck.once()
        reads = (await ar.info("stats"))["total_reads_processed"] - reads_before
        calls = await command_calls(ar)
        # One HGET a waiter a tick, in one STATES script a partition, and nothing else (it used
        # to be a pipeline of HGET and GET apiece, then a pipeline of an HGET apiece). The socket
        # reads Redis processed (its total_reads_processed) are a few per partition a tick,
        # where a pipeline per waiter made at least one each: 1,200 here.
        asks = len(chunks(ids))  # a STATES per chunk of a partition's: one or more in each
        assert asks >= partitions
        assert calls.pop("hget") == 3 * n
        assert calls.pop("evalsha") == 3 * asks
        assert set(calls) <= {"config|resetstat", "info"}
        assert reads <= 3 * 6 * asks + 4, reads
        assert not any(w.done() for w in waiters)
        # One ends with its event lost: the next tick wakes that one only, and it reads its record.
        record = await settle(ar, ids[0])
        await executions.recheck.once()
        assert await asyncio.wait_for(waiters[0], 5) == record
        assert not any(w.done() for w in waiters[1:])
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


async def test_a_pass_spreads_its_chunks_and_wakes_each_chunks_waiters_before_the_next(
        ar: redis.asyncio.Redis) -> None:
    """Ten thousand waiters are a hundred STATES of 100: asked back to back, they held Redis and the
    process for some 30 ms every tick. A pass now leaves a gap between two (half the period over
    the chunks, at most MAX_GAP_S), and the ended ones' waiters do not wait for the rest."""
    expected = Expected()
    ids = [await submitted(ar, partition=0) for _ in range(6)]  # one partition's chunks, in order
    await settle(ar, ids[0])
    boxes = {e: Mailbox() for e in ids}
    expected.update({e: {box} for e, box in boxes.items()})  # as expect() would
    asked: list[tuple[float, list[str], bool]] = []  # when each chunk was asked, and if ids[0] was woken by then

    async def woken(box: Mailbox) -> bool:
        return await box.get(timeout=0) == ENDED

    class Timed(Reads):
        async def ended(self, some: list[str]) -> list[str]:
            asked.append((time.monotonic(), some, await woken(boxes[ids[0]])))
            return await super().ended(some)

    every = 0.4
    await Recheck(Timed(ar), expected, every=every, chunk=2).once()
    assert [some for _, some, _ in asked] == [ids[0:2], ids[2:4], ids[4:6]]
    gap = min(recheck_module.MAX_GAP_S, every * recheck_module.SPREAD / 3)
    assert all(later - earlier >= gap for (earlier, _, _), (later, _, _) in itertools.pairwise(asked))
    # ids[0]'s waiter had its ENDED by the time chunk two was asked (taken then: none by chunk three).
    assert [woken for _, _, woken in asked] == [False, True, False]
    assert not any([await woken(boxes[e]) for e in ids[1:]])


async def test_ended_asks_in_chunks_of_one_partition(ar: redis.asyncio.Redis) -> None:
    with cells.partitions(3):
        ids = [await submitted(ar, partition=i % 3) for i in range(20)]
        await settle(ar, ids[3])
        await ar.delete(keys.execution(ids[7]), keys.execution(ids[11]))  # partitions 1 and 2
        some = chunks(ids, 2)
        assert all(len(c) <= 2 and len({keys.partition_of(e) for e in c}) == 1 for c in some)
        assert sorted(e for c in some for e in c) == sorted(ids)
        ended = [e for c in some for e in await Reads(ar).ended(c)]
        assert sorted(ended) == sorted([ids[3], ids[7], ids[11]])


async def test_a_redis_out_of_reach_is_noted_and_its_return_too(ar: redis.asyncio.Redis) -> None:
    gone = redis.asyncio.Redis(port=1, socket_connect_timeout=0.5)  # nothing listens there
    expected = Expected()
    recheck = Recheck(Reads(gone), expected)
    with expected.expect(keys.new_execution_id()):
        with pytest.raises(redis.exceptions.ConnectionError):
            await recheck.once()
        assert recheck.down_since is not None
    await gone.aclose()
    recheck._reads = Reads(ar)  # Redis is back
    with expected.expect(await submitted(ar)):
        await recheck.once()
    assert recheck.down_since is None


async def test_a_waiter_answers_store_unavailable_once_redis_was_out_of_reach_too_long(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executions_module, "PATIENCE_S", 0.2)
    gone = redis.asyncio.Redis(port=1, socket_connect_timeout=0.5)  # nothing listens there
    expected = Expected()
    executions = Executions(gone, app_settings(retention=RETENTION), waiting=expected)
    exec_id = keys.new_execution_id()
    with expected.expect(exec_id) as mailbox:
        answer = asyncio.create_task(executions.outcome(exec_id, "t", mailbox, tick=0.05))
        with pytest.raises(redis.exceptions.ConnectionError):
            await executions.recheck.once()
        record = await asyncio.wait_for(answer, 5)  # its ticks, with no command of their own, see it
    assert record.error_code == "STORE_UNAVAILABLE"
    await gone.aclose()


async def test_a_waiter_with_a_long_tick_answers_store_unavailable_when_its_patience_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream's tick is its keep-alive period, longer than the patience may be: once its read
    after the hub's reconnection fails, the waiter wakes when its patience ends, not at its tick."""
    monkeypatch.setattr(executions_module, "PATIENCE_S", 0.2)
    gone = redis.asyncio.Redis(port=1, socket_connect_timeout=0.5)  # nothing listens there
    executions = Executions(gone, app_settings(retention=RETENTION), waiting={})
    mailbox = Mailbox()
    answer = asyncio.create_task(executions.outcome(keys.new_execution_id(), "t", mailbox, tick=NEVER))
    mailbox.put_nowait(RESYNC)  # what the hub tells every waiter when its connection drops
    record = await asyncio.wait_for(answer, 5)
    assert record.error_code == "STORE_UNAVAILABLE"
    await gone.aclose()
