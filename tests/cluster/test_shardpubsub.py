"""Sharded pub/sub: a listener hears each channel on its shard, and hears it again after the
channel's slot moves to another primary, after that primary is killed and replaced, and after it
hangs and is replaced (still hung)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from bench.localcluster import ClusterServer, LocalCluster
from carmy_worker.store.cluster import StoreCluster
from carmy_worker.store.pubsub import Message
from carmy_worker.store.shardpubsub import listen_sharded_forever
from tests.cluster.conftest import cluster_client
from tests.support import wait_until_async

CHANNELS = ["{c:0}events", "{c:1}events", "{c:2}events", "{c:3}events"]
# How soon a hung primary's channels are heard from its promoted replica: well under the API
# hub's recheck (a re-read about every 5 s), which alone answered its partitions' calls meanwhile.
PROMPTLY_S = 3.0


class Ear:
    """A listener on ``CHANNELS`` in a task, and what it heard."""

    def __init__(self, cluster: StoreCluster) -> None:
        self.cluster = cluster
        self.heard: list[tuple[str, bytes]] = []
        self.drops = 0
        self.dropped: list[list[str]] = []  # the channels of each connection that ended
        self.connects: list[bool] = []
        self.task = asyncio.create_task(listen_sharded_forever(
            cluster, lambda: CHANNELS, self.on_message, name="test", on_connect=self.connects.append,
            on_drop=self.on_drop, max_backoff=0.2))

    def on_message(self, message: Message) -> None:
        if message["type"] == "message":
            self.heard.append((message["channel"].decode(), message["data"]))

    def on_drop(self, channels: Collection[str]) -> None:
        self.drops += 1
        self.dropped.append(sorted(channels))

    async def hears(self, channel: str, data: bytes, timeout: float = 30.0,
                    publish: Callable[[str, bytes], Awaitable[object]] | None = None) -> None:
        """Publishes ``data`` on ``channel`` (through the cluster client, or ``publish``) until
        the listener has heard it (a publication made while it resubscribes is lost, as
        documented)."""
        async def heard() -> bool:
            # Just after a failover, the client's first call may still find the dead primary:
            # a connection error (the documented, retryable kind), then it reloads the slots.
            with contextlib.suppress(RedisConnectionError):
                if publish is None:
                    await self.cluster.execute_command("SPUBLISH", channel, data)
                else:
                    await publish(channel, data)
            await asyncio.sleep(0.05)
            return (channel, data) in self.heard

        deadline = asyncio.get_running_loop().time() + timeout
        while not await heard():
            assert asyncio.get_running_loop().time() < deadline, f"{channel} not heard: {self.heard[-5:]}"


@pytest.fixture
async def ear(redis_cluster: LocalCluster) -> AsyncIterator[Ear]:
    cluster = cluster_client(redis_cluster, max_connections=4)
    ear = Ear(cluster)
    yield ear
    ear.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await ear.task
    await cluster.aclose()


async def test_each_channel_is_heard_from_its_own_shard(ear: Ear, redis_cluster: LocalCluster) -> None:
    # A connection per primary owning a channel, each subscribed once.
    shards = {redis_cluster.owner(ear.cluster.keyslot(c)).port for c in CHANNELS}
    await wait_until_async(lambda: len(ear.connects) == len(shards))
    assert not any(ear.connects)
    for channel in CHANNELS:
        await ear.hears(channel, b"hello")
    assert len(shards) > 1
    # A message on one shard reaches no other: exactly one copy of each.
    assert sorted(ear.heard) == sorted((c, b"hello") for c in CHANNELS)


@pytest.mark.slow
async def test_a_channel_is_heard_again_after_its_slot_moves(ear: Ear, redis_cluster: LocalCluster) -> None:
    channel = CHANNELS[0]
    await ear.hears(channel, b"before")
    slot = ear.cluster.keyslot(channel)
    target = next(p for p in redis_cluster.primaries() if p is not redis_cluster.owner(slot))
    await asyncio.to_thread(redis_cluster.move_slot, slot, target)
    await ear.hears(channel, b"after")
    assert ear.drops >= 1 and ear.connects[-1] is True  # it resubscribed, and said so
    # Only the connection that carried the moved slot's channel ended: the others went on.
    assert all(channel in dropped for dropped in ear.dropped)


@pytest.mark.slow
async def test_a_channel_is_heard_again_after_its_primary_is_killed(ear: Ear, redis_cluster: LocalCluster) -> None:
    channel = CHANNELS[1]
    await ear.hears(channel, b"before")
    victim = redis_cluster.owner(ear.cluster.keyslot(channel))
    index = redis_cluster.primaries().index(victim)
    its_own = {c for c in CHANNELS if redis_cluster.owner(ear.cluster.keyslot(c)) is victim}
    await asyncio.to_thread(redis_cluster.kill_primary, index)
    await ear.hears(channel, b"after")
    # Only the dead primary's channels were dropped and subscribed again: the others went on.
    assert ear.dropped and all(set(dropped) <= its_own for dropped in ear.dropped)
    # Dropped once: the attempts that failed while the node was dead (it refused connections
    # until its replica was promoted) had subscribed nothing, and drop nothing.
    assert all(sum(c in dropped for dropped in ear.dropped) == 1 for c in its_own), ear.dropped
    for other in CHANNELS:
        await ear.hears(other, b"everywhere")
    await asyncio.to_thread(redis_cluster.restart, victim)


def replica_of(cluster: LocalCluster, primary: ClusterServer) -> ClusterServer:
    its_id = primary.node_id()
    return cluster.server_on(next(n.port for n in cluster.topology() if n.primary_id == its_id))


def on(server: ClusterServer) -> Callable[[str, bytes], Awaitable[object]]:
    """``SPUBLISH`` on ``server`` itself."""
    def publish(channel: str, data: bytes) -> object:
        with server.check_client() as client:
            return client.execute_command("SPUBLISH", channel, data)
    return lambda channel, data: asyncio.to_thread(publish, channel, data)


@pytest.mark.slow
async def test_a_channel_is_heard_from_the_promoted_replica_while_its_primary_still_hangs(
        ear: Ear, redis_cluster: LocalCluster) -> None:
    """A primary that hangs (stopped: it answers nothing and resets no connection) ends none of
    its subscribers' connections, and a subscribed connection has no reply timeout (a quiet
    channel is not a dead one). Once its replica is promoted, the listener leaves it, says which
    channels it dropped, and hears them from the replica, the old primary still stopped: it used
    to hear nothing on them until that node woke."""
    channel = CHANNELS[1]
    await ear.hears(channel, b"before")
    victim = redis_cluster.owner(ear.cluster.keyslot(channel))
    its_own = sorted(c for c in CHANNELS if redis_cluster.owner(ear.cluster.keyslot(c)) is victim)
    heir = replica_of(redis_cluster, victim)
    try:
        promoted = await asyncio.to_thread(redis_cluster.hang_primary, victim, wake=False)
        await ear.hears(channel, b"after", timeout=promoted + PROMPTLY_S - time.time(), publish=on(heir))
        # Its channels dropped once each (the API's hub has their waiters re-read), the others not.
        assert sorted(c for dropped in ear.dropped for c in dropped) == its_own, ear.dropped
        assert ear.connects[-1] is True
    finally:
        await asyncio.to_thread(redis_cluster.wake, victim)  # the next test's cluster is whole


async def test_a_plain_channel_rides_on_one_shard_and_hears_a_publish_sent_to_any_node(
        redis_cluster: LocalCluster) -> None:
    """The catalog's channel: ``SUBSCRIBE`` on one of the listener's connections, and
    ``StoreCluster.publish`` on a random node (primary or replica); the cluster delivers each
    message on every node, the listener's included."""
    cluster = cluster_client(redis_cluster, max_connections=4)
    heard: list[tuple[str, bytes]] = []
    confirmed: list[bytes] = []

    def on_message(message: Message) -> None:
        if message["type"] == "message":
            heard.append((message["channel"].decode(), message["data"]))
        elif message["type"] == "subscribe":
            confirmed.append(message["channel"])

    task = asyncio.create_task(listen_sharded_forever(cluster, lambda: CHANNELS[:1], on_message, name="test",
                                                      broadcast=lambda: ["catalog"]))
    try:
        await wait_until_async(lambda: sorted(confirmed) == sorted([CHANNELS[0].encode(), b"catalog"]))
        sent = [str(i).encode() for i in range(20)]
        for data in sent:
            await cluster.publish("catalog", data)
        await wait_until_async(lambda: len(heard) >= len(sent))
        # In any order: sent to different nodes, they cross the cluster bus by different paths.
        assert sorted(heard) == sorted(("catalog", data) for data in sent)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await cluster.aclose()
