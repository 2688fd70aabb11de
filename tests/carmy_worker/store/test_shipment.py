"""The sink's consumer group (store.shipment), against the real Redis: entries written before
the group are not shipped, those after go to one consumer each; a consumer's unacknowledged
entries come back to it, and to another once idle long enough; trimmed ones are dropped; a
lost group is told apart from other refusals; consumers long gone are forgotten."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio
from redis.exceptions import ResponseError

from carmy_worker.store import keys
from carmy_worker.store.audit import stream_id, trail_id
from carmy_worker.store.shipment import CLAIM_IDLE_MS, GROUP, Shipment, group_lost
from tests.support import RedisServer


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    c = redis.asyncio.Redis.from_url(redis_server.url)
    await c.flushall()
    yield c
    await c.aclose()


def stream() -> str:
    """The stream these tests write: partition 0's (tests/carmy_worker/store/test_audit.py
    writes every partition's)."""
    return keys.audit(0)


async def append(client: redis.asyncio.Redis, execution_id: str) -> str:
    """An entry as the scripts write one (store.lua's audit), with only what a test reads: its
    id in the trail."""
    entry_id = await client.xadd(stream(), {"execution_id": execution_id, "tool": "echo", "status": "completed",
                                            "finished_at": 1_700_000_000_000, "via": "http"})
    return trail_id(entry_id, 0)


def in_stream(entry_id: str) -> str:
    return stream_id(entry_id)[1]


async def age(client: redis.asyncio.Redis, consumer: str, entry_id: str, idle_ms: int) -> None:
    """Make ``entry_id`` pending for ``consumer`` as if delivered ``idle_ms`` ago (XCLAIM's IDLE)."""
    await client.xclaim(stream(), GROUP, consumer, 0, [in_stream(entry_id)], idle=idle_ms)


async def test_only_entries_after_the_group_are_shipped_each_to_one_consumer(client: redis.asyncio.Redis) -> None:
    await append(client, "before")
    one, two = Shipment(client, "one"), Shipment(client, "two")
    await one.join()
    await two.join()  # BUSYGROUP: the group is there already, nothing changes
    after = [await append(client, f"after-{i}") for i in range(3)]
    first = await one.read(2, block_ms=100)
    second = await two.read(10, block_ms=100)
    assert [e.execution_id for e in first.entries] == ["after-0", "after-1"]
    assert [e.execution_id for e in second.entries] == ["after-2"]
    assert (await one.read(10, block_ms=10)).entries == []
    assert first.ids + second.ids == after


async def test_unacknowledged_entries_come_back_to_their_consumer_then_to_another(
        client: redis.asyncio.Redis) -> None:
    dead, alive = Shipment(client, "dead"), Shipment(client, "alive")
    await dead.join()
    entry_id = await append(client, "pending")
    assert (await dead.read(10, block_ms=100)).ids == [entry_id]
    assert (await dead.pending(10)).ids == [entry_id]  # as a restarted loop of the same consumer sees it
    assert (await alive.claim_stale(10)).ids == []  # not idle long enough: its consumer may be writing it
    await age(client, "dead", entry_id, CLAIM_IDLE_MS + 1)
    assert [e.execution_id for e in (await alive.claim_stale(10)).entries] == ["pending"]
    await alive.ack([entry_id])
    assert (await dead.pending(10)).ids == [] and (await alive.pending(10)).ids == []


async def test_entries_trimmed_while_pending_are_dropped_not_shipped(client: redis.asyncio.Redis) -> None:
    shipment = Shipment(client, "one")
    await shipment.join()
    gone, kept = await append(client, "gone"), await append(client, "kept")
    await shipment.read(10, block_ms=100)
    await client.xdel(stream(), in_stream(gone))  # as a trim takes the oldest
    lot = await shipment.pending(10)
    assert ([e.execution_id for e in lot.entries], lot.gone) == (["kept"], [gone])
    await shipment.ack(lot.ids)
    assert (await shipment.pending(10)).ids == []
    trimmed = await append(client, "trimmed")
    await shipment.read(10, block_ms=100)
    await client.xdel(stream(), in_stream(trimmed))
    await age(client, "one", trimmed, CLAIM_IDLE_MS + 1)
    assert (await Shipment(client, "other").claim_stale(10)).ids == []  # XAUTOCLAIM drops it
    assert (await shipment.pending(10)).ids == [] and kept


async def test_a_lost_group_is_told_apart(client: redis.asyncio.Redis) -> None:
    shipment = Shipment(client, "one")
    await shipment.join()
    await client.delete(stream())
    with pytest.raises(ResponseError) as lost:
        await shipment.read(10, block_ms=10)
    assert group_lost(lost.value)
    assert not group_lost(ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"))
    await shipment.join()  # MKSTREAM: the stream and the group again
    await append(client, "again")
    assert [e.execution_id for e in (await shipment.read(10, block_ms=100)).entries] == ["again"]


async def test_consumers_long_gone_with_nothing_pending_are_forgotten(client: redis.asyncio.Redis) -> None:
    me, gone, busy = Shipment(client, "me"), Shipment(client, "gone"), Shipment(client, "busy")
    await me.join()
    await client.xgroup_createconsumer(stream(), GROUP, me.consumer)
    await append(client, "held")
    await busy.read(10, block_ms=100)  # holds the entry, unacknowledged
    await client.xgroup_createconsumer(stream(), GROUP, gone.consumer)  # as a read that got nothing pending
    assert await me.forget_gone_consumers() == 0  # the default bound: everyone was seen just now
    await asyncio.sleep(0.05)
    # "gone"; "busy" only where it holds nothing: any other partition's group it is a consumer of
    # (its read named every stream; whether that made it one where it got nothing is Redis's
    # version's choice: 7.0 does not); never itself.
    elsewhere = [p for p in keys.partitions() if p != 0
                 and "busy" in {c["name"].decode() for c in await client.xinfo_consumers(keys.audit(p), GROUP)}]
    assert await me.forget_gone_consumers(idle_ms=20) == 1 + len(elsewhere)
    for p in elsewhere:
        assert await client.xinfo_consumers(keys.audit(p), GROUP) == []
    names = {c["name"].decode() for c in await client.xinfo_consumers(stream(), GROUP)}
    assert names == {"me", "busy"}
