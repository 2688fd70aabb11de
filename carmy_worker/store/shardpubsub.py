"""Sharded pub/sub on a Redis Cluster (``SSUBSCRIBE``, Redis 7): ``listen_sharded_forever``, the
cluster's twin of ``store.pubsub.listen_forever``, and ``listen``, which picks the one that fits
the client (what the API's hub and a worker's cancel listener call).

redis-py 5.3 has no pub/sub on its asyncio ``RedisCluster`` (only the synchronous client's
``ClusterPubSub.ssubscribe``, which polls). A sharded channel lives in the slot of its name
(hash tags apply, as for keys): ``SPUBLISH`` goes to the primary of that slot and reaches the
connections subscribed there (and on its replicas), never the other shards. So a listener keeps
one connection per primary that owns one of its channels, and ``SSUBSCRIBE`` there, one command
per slot (a command's channels must share one). Plain channels (``SUBSCRIBE``) are delivered by
every node of a cluster: they ride on one of those connections.

Each connection stands alone. When one ends (its node died or was killed, a ``MOVED`` reply: the
slot is elsewhere, or an ``sunsubscribe`` the node sent by itself: its slot migrated away, or it
was demoted), only the channels it carried are subscribed again, where the slot table then places
them; the other shards' subscriptions go on, so that a dead primary costs the listener its own
channels, not every partition's. Before each new attempt it reloads the slot table (``CLUSTER
SLOTS`` from the nodes it knows, those whose connections just ended asked last), with a backoff
(0.1 s doubling up to ``max_backoff``) while that fails: during a failover, until a replica is
promoted (``cluster-node-timeout`` + about 1 s). As with ``listen_forever``, messages published
while a channel is subscribed again are lost: ``on_drop(channels)`` says which, and when that
window opens; their confirmations, when it closes.

A primary that hangs (a stopped process, a partition without a reset) ends none of its
connections, and they have no reply timeout: the cluster promotes its replica, and the
publications of its slots go there, unheard. So, while its connections are up, the listener
asks the slot table every ``WATCH_EVERY_S`` (one ``CLUSTER SLOTS`` on a connection of its own,
bounded by ``SLOTS_TIMEOUT_S``, a node that does not answer left for another:
``store.slotwatch``) and ends each connection whose node the table no longer names for one of
its slots, as one that dropped (``on_drop``, once, then subscribed again where the table places
them). A hung primary's channels are heard from its promoted replica within about a second of
the promotion, the node still hung.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from carmy_worker.store.cluster import StoreCluster
from carmy_worker.store.pubsub import Message, listen_forever, raise_if_cancelled, stop_if_cancelled
from carmy_worker.store.slotwatch import SlotTable, SlotWatch

log = logging.getLogger("carmy.pubsub")

# How often a listener whose connections are all up asks the slot table (``store.slotwatch``)
# whether their nodes still serve their channels' slots: a primary that hangs ends none of them.
WATCH_EVERY_S = 1.0

# The kinds of a sharded subscription's replies, as ``listen_forever`` names the plain ones (so
# that one ``on_message`` serves both).
KINDS = {b"smessage": "message", b"ssubscribe": "subscribe", b"sunsubscribe": "unsubscribe",
         b"message": "message", b"subscribe": "subscribe", b"unsubscribe": "unsubscribe"}


class ShardMoved(RedisConnectionError):
    """A node ended a subscription by itself (``sunsubscribe``): its slot is served elsewhere."""


class NotSubscribed(RedisConnectionError):
    """A connection that failed before its subscriptions were sent: nothing was dropped."""


class Shard:
    """One connection of a listener: its node, its sharded channels by slot (a command's channels
    must share one), the plain ones riding on it, and whether their subscriptions were sent."""

    __slots__ = ("broadcast", "node", "slots", "subscribed")

    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.slots: dict[int, list[str]] = {}
        self.broadcast: list[str] = []
        self.subscribed = False

    @property
    def sharded(self) -> list[str]:
        return [c for names in self.slots.values() for c in names]

    @property
    def channels(self) -> list[str]:
        return [*self.sharded, *self.broadcast]

    def moved(self, table: SlotTable) -> bool:
        """Whether ``table`` names another primary for one of its slots (a slot it names none for
        is left to the node, which says so itself if it stopped serving it)."""
        return any(table.owner(slot) not in (None, self.node.name) for slot in self.slots)


def _by_node(cluster: StoreCluster, channels: Collection[str], broadcast: Collection[str]) -> list[Shard]:
    """``channels`` by the primary of their slot, per the slot table now; the ``broadcast`` ones
    with the first node (or a random primary's when there are no others): a plain ``PUBLISH``
    reaches every node of a cluster."""
    by_node: dict[str, Shard] = {}
    for channel in channels:
        slot = cluster.keyslot(channel)
        node = cluster.nodes_manager.get_node_from_slot(slot)
        by_node.setdefault(node.name, Shard(node)).slots.setdefault(slot, []).append(channel)
    if broadcast:
        if not by_node:
            node = cluster.get_random_node()
            by_node[node.name] = Shard(node)
        next(iter(by_node.values())).broadcast.extend(broadcast)
    return list(by_node.values())


async def _serve(shard: Shard, on_message: Callable[[Message], None], on_connect: Callable[[bool], None] | None,
                 after_drop: bool) -> None:
    """One connection to ``shard``'s node: ``SSUBSCRIBE`` per slot, ``SUBSCRIBE`` to its
    broadcast channels, and every reply to ``on_message`` until it fails (raised). The connection
    is the cluster client's kind (its password, TLS and parser, which turns a ``MOVED`` reply into
    ``MovedError``) but not from its pools, and has no read timeout: a quiet channel is not a dead
    one."""
    node = shard.node
    connection = node.connection_class(**{**node.connection_kwargs, "socket_timeout": None})
    try:
        try:
            await connection.connect()
            for names in shard.slots.values():
                await connection.send_command("SSUBSCRIBE", *names)
            if shard.broadcast:
                await connection.send_command("SUBSCRIBE", *shard.broadcast)
        except Exception as exc:  # a node dead, or not there yet
            raise_if_cancelled(exc)
            raise NotSubscribed(f"{node.name}: {exc}") from exc
        shard.subscribed = True
        if on_connect is not None:
            on_connect(after_drop)
        await _read(node.name, connection, on_message)
    finally:
        with contextlib.suppress(Exception):
            await connection.disconnect()


async def _ended(serving: dict[asyncio.Task[None], Shard], watch: SlotWatch) -> set[asyncio.Task[None]]:
    """The connections that end: by themselves (their node lost, ``MOVED``, its ``sunsubscribe``),
    or ended here once the slot table (asked every ``WATCH_EVERY_S`` meanwhile) names another
    primary for one of their slots: a primary that hangs ends none of them until it wakes."""
    while True:
        ended, _ = await asyncio.wait(serving, timeout=WATCH_EVERY_S, return_when=asyncio.FIRST_COMPLETED)
        if ended:
            return ended
        table = await watch.table()
        moved = {task for task, shard in serving.items() if table is not None and shard.moved(table)}
        if moved:
            for task in moved:
                task.cancel()  # none if it ended meanwhile: it is seen ended, once
            await asyncio.wait(moved)
            return moved | {task for task in serving if task.done()}


async def _read(node: str, connection: AbstractConnection, on_message: Callable[[Message], None]) -> None:
    while True:
        message = _message(await connection.read_response())
        on_message(message)
        if message["type"] == "unsubscribe":
            raise ShardMoved(f"{node} dropped the subscription to {message['channel']!r}")


def _message(reply: list[Any]) -> Message:
    """A sharded reply as ``listen_forever`` gives a plain one: ``message`` (channel, data),
    ``subscribe`` or ``unsubscribe`` (channel, count)."""
    kind = KINDS.get(reply[0], reply[0].decode() if isinstance(reply[0], bytes) else reply[0])
    return {"type": kind, "pattern": None, "channel": reply[1], "data": reply[2]}


async def refresh(cluster: StoreCluster, last: Collection[str] = ()) -> None:
    """Reload the slot table from the nodes the client knows, in a turn of the client's (it
    takes a connection of a node). redis-py asks them in turn, each for up to
    ``SLOTS_TIMEOUT_S``: the nodes named in ``last`` (whose connections just ended: one may hang)
    are asked last."""
    async with cluster.turn():
        manager = cluster.nodes_manager
        manager.startup_nodes = dict(sorted(manager.startup_nodes.items(), key=lambda seed: seed[0] in last))
        await cluster.initialize()
        await manager.initialize()


async def listen(
    redis: Redis,
    sharded: Callable[[], Collection[str]],
    on_message: Callable[[Message], None],
    *,
    name: str,
    broadcast: Callable[[], Collection[str]] = tuple,
    on_connect: Callable[[bool], None] | None = None,
    on_drop: Callable[[Collection[str]], None] | None = None,
    max_backoff: float = 1.0,
) -> None:
    """Subscribe to the sharded channels ``sharded()`` and the plain ones ``broadcast()`` of
    ``redis``, whichever Redis it is: on a Redis Cluster (``StoreCluster``) a connection per
    shard (``listen_sharded_forever``), else one connection (``listen_forever``). Every message
    goes to ``on_message``, until cancelled; ``on_connect(after_drop)`` and ``on_drop`` as both say."""
    if isinstance(redis, StoreCluster):
        await listen_sharded_forever(redis, sharded, on_message, name=name, on_connect=on_connect, on_drop=on_drop,
                                     max_backoff=max_backoff, broadcast=broadcast)
    else:
        await listen_forever(redis, broadcast, on_message, name=name, on_connect=on_connect, on_drop=on_drop,
                             max_backoff=max_backoff, sharded=sharded)


async def listen_sharded_forever(
    cluster: StoreCluster,
    channels: Callable[[], Collection[str]],
    on_message: Callable[[Message], None],
    *,
    name: str,
    on_connect: Callable[[bool], None] | None = None,
    on_drop: Callable[[Collection[str]], None] | None = None,
    max_backoff: float = 1.0,
    broadcast: Callable[[], Collection[str]] = tuple,
) -> None:
    """``SSUBSCRIBE`` to ``channels()``, each on its shard, and ``SUBSCRIBE`` to ``broadcast()``
    on one node, and hand every message (subscribe confirmations included, typed as
    ``listen_forever`` types them) to ``on_message``, until cancelled. ``on_connect(after_drop)``
    runs once a connection's subscriptions are sent; ``on_drop(channels)`` whenever such a
    connection ends, naming the channels it carried (one that failed before it subscribed drops
    nothing, and is retried quietly), or is ended here because the slot table names another
    primary for one of them (the module's docstring: a primary that hangs). ``cluster`` is used
    for its slot table (rebuilt here after each failure) and its connection options; it may be
    shared (``StoreCluster`` keeps the connections of its nodes when its table is rebuilt)."""
    serving: dict[asyncio.Task[None], Shard] = {}  # each connection's share
    waiting, plain = list(channels()), list(broadcast())  # not subscribed now
    delay, lost = 0.1, False
    left: set[str] = set()  # the nodes whose connections ended last
    watch = SlotWatch(cluster)
    loop = asyncio.get_running_loop()
    try:
        while True:
            stop_if_cancelled()  # a refresh below may have swallowed it
            if waiting or plain:
                try:
                    if lost:
                        await refresh(cluster, last=left)
                    else:
                        async with cluster.turn():  # the slot table's first load takes a node's connection
                            await cluster.initialize()
                    shards = _by_node(cluster, waiting, plain)
                except Exception as exc:  # no node answers yet
                    raise_if_cancelled(exc)
                    if not lost:
                        log.warning("%s: no slot table (%s); trying again", name, exc)
                    lost = True
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, max_backoff)
                    continue
                for shard in shards:
                    serving[asyncio.create_task(_serve(shard, on_message, on_connect, lost))] = shard
                waiting, plain = [], []
            if not serving:  # no channel at all
                await asyncio.Event().wait()
            since = loop.time()
            ended = await _ended(serving, watch)
            if loop.time() - since > 5 * max_backoff:  # they had been up a while: a new episode
                delay = 0.1
            left = set()
            for task in ended:
                shard = serving.pop(task)
                waiting += shard.sharded
                plain += shard.broadcast
                left.add(shard.node.name)
                why = "its node no longer serves their slots" if task.cancelled() else task.exception()
                if not shard.subscribed:
                    # Its channels were down already: said once, at the first attempt of an episode.
                    if delay == 0.1:
                        log.warning("%s: cannot subscribe (%s); trying again", name, why)
                    continue
                log.warning("%s: a shard's subscription ended (%s); subscribing its %d channels again",
                            name, why, len(shard.channels))
                if on_drop is not None:
                    on_drop(shard.channels)
            lost = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_backoff)
    finally:
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)
        await watch.close()
        if on_drop is not None and serving:
            on_drop([c for shard in serving.values() for c in shard.channels])
