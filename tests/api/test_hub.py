"""The hub when Redis goes away: waiting requests re-read at once, new ones are refused at once,
and both work again once the process's channel is subscribed anew."""

from __future__ import annotations

import shutil

import pytest
import redis.asyncio

from api.events.hub import RESYNC, EventHub, HubUnavailable
from carmy_worker.store import keys
from tests.cells import partitions
from tests.support import RedisServer, new_tmp, wait_until_async


async def test_a_dropped_connection_resyncs_waiters_and_refuses_new_calls_until_it_is_back() -> None:
    tmp = new_tmp()
    server = RedisServer(tmp)
    server.start()
    listener = redis.asyncio.Redis.from_url(server.url)
    hub = EventHub(listener)
    # Real ids: the channel an execution's events reach is its partition's (``keys.partition_of``).
    waiting_id, other_id, new_id = (keys.new_execution_id() for _ in range(3))
    try:
        await hub.start()
        with hub.expect(waiting_id) as waiting:
            with server.client() as control:
                control.spublish(hub.channel_for(waiting_id), waiting_id.encode() + b" first")
                control.spublish(hub.channel_for(other_id), other_id.encode() + b" not-mine")
            assert await waiting.get() == b"first"
            server.kill()
            # The request that waits is told to re-read its record, without waiting for a timeout.
            assert await waiting.get() == RESYNC
            with pytest.raises(HubUnavailable), hub.expect(new_id):
                pass
            server.start()
            await wait_until_async(lambda: hub._confirmed.is_set(), what="the process channel subscribed again")
            # Events published while the channel was not subscribed were lost: told again.
            assert await waiting.get() == RESYNC
        with hub.expect(new_id) as fresh, server.client() as control:
            control.spublish(hub.channel_for(new_id), new_id.encode() + b" hello")
            assert await fresh.get() == b"hello"
    finally:
        await hub.close()
        await listener.aclose()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


async def test_a_channel_dropped_alone_refuses_and_resyncs_its_partition_only() -> None:
    """On a cluster each shard's subscription ends on its own (``store.shardpubsub``): a dead
    primary's channel refuses the calls of its partition and tells their waiters to re-read,
    while the other partitions' calls go on untouched."""
    with partitions(4):
        hub = EventHub(redis.asyncio.Redis())  # never started: the test plays the listener's part
        ids = {p: keys.new_execution_id(p) for p in keys.partitions()}
        for channel in hub.channels:  # every channel confirmed
            hub._dispatch({"type": "subscribe", "pattern": None, "channel": channel.encode(), "data": 1})
        with hub.expect(ids[1]) as lost, hub.expect(ids[2]) as kept:
            hub._dropped([hub.channels[1], "catalog"])
            assert await lost.get(timeout=0) == RESYNC and await kept.get(timeout=0) is None
            with pytest.raises(HubUnavailable), hub.expect(keys.new_execution_id(1)):
                pass
            with hub.expect(keys.new_execution_id(2)):  # another partition: taken
                pass
            hub._dispatch({"type": "subscribe", "pattern": None, "channel": hub.channels[1].encode(), "data": 1})
            # Events published before the confirmation were lost: its waiters are told again.
            assert await lost.get(timeout=0) == RESYNC and await kept.get(timeout=0) is None
            with hub.expect(keys.new_execution_id(1)):
                pass
