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

When the cluster changes under it, it subscribes again, everywhere, to what ``channels()`` says
then: a connection lost (the node died or was killed), a ``MOVED`` reply (the slot is
elsewhere), or an ``sunsubscribe`` the node sent by itself (its slot migrated away, or it was
demoted). Before each new attempt it reloads the slot table (``CLUSTER SLOTS`` from the nodes
it knows), with a backoff (0.1 s doubling up to ``max_backoff``) while that fails: during a
failover, until a replica is promoted (``cluster-node-timeout`` + about 1 s). As with
``listen_forever``, messages published while it resubscribes are lost: ``on_drop`` says when
that window opens and ``on_connect(after_drop=True)`` when it closes.
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

log = logging.getLogger("carmy.pubsub")

# The kinds of a sharded subscription's replies, as ``listen_forever`` names the plain ones (so
# that one ``on_message`` serves both).
KINDS = {b"smessage": "message", b"ssubscribe": "subscribe", b"sunsubscribe": "unsubscribe",
         b"message": "message", b"subscribe": "subscribe", b"unsubscribe": "unsubscribe"}


class ShardMoved(RedisConnectionError):
    """A node ended a subscription by itself (``sunsubscribe``): its slot is served elsewhere."""


class ShardSet:
    """One subscribed connection per primary owning one of the channels, opened by
    ``subscribe`` and read by ``run`` until one of them fails; ``aclose`` closes them all.

    The connections are the cluster client's kind (its password, TLS and parser, which turns
    a ``MOVED`` reply into ``MovedError``) but not from its pools, and have no read timeout: a
    quiet channel is not a dead one."""

    def __init__(self, cluster: StoreCluster) -> None:
        self.cluster = cluster
        self.connections: dict[str, AbstractConnection] = {}  # by node name (host:port)

    async def subscribe(self, channels: Collection[str], broadcast: Collection[str] = ()) -> None:
        """``SSUBSCRIBE`` to every channel on the primary of its slot, per the slot table now,
        and ``SUBSCRIBE`` to the ``broadcast`` ones on one of those connections (or on a random
        primary's when there are none): a plain ``PUBLISH`` reaches every node of a cluster.
        The confirmations come to ``run``'s ``on_message`` (or a ``MOVED`` to its failure)."""
        async with self.cluster.turn():  # the slot table's first load takes a node's connection
            await self.cluster.initialize()
        by_node: dict[str, tuple[ClusterNode, dict[int, list[str]]]] = {}
        for channel in channels:
            slot = self.cluster.keyslot(channel)
            node = self.cluster.nodes_manager.get_node_from_slot(slot)
            by_node.setdefault(node.name, (node, {}))[1].setdefault(slot, []).append(channel)
        if broadcast and not by_node:
            node = self.cluster.get_random_node()
            by_node[node.name] = (node, {})
        for name, (node, slots) in by_node.items():
            connection = node.connection_class(**{**node.connection_kwargs, "socket_timeout": None})
            self.connections[name] = connection
            await connection.connect()
            for names in slots.values():
                await connection.send_command("SSUBSCRIBE", *names)
            if broadcast:
                await connection.send_command("SUBSCRIBE", *broadcast)
                broadcast = ()

    async def run(self, on_message: Callable[[Message], None]) -> None:
        """Hand every reply of every connection to ``on_message`` until one fails: that error is
        raised (the first, if several), the others' reads cancelled."""
        try:
            async with asyncio.TaskGroup() as group:
                for node, connection in self.connections.items():
                    group.create_task(_read(node, connection, on_message))
                # Wait in the body, where the group's cancellation lands when a read fails: on
                # Python 3.11, a read that fails while __aexit__ waits leaves this task's
                # cancelling() count raised, and every loop here would take that for a shutdown.
                await asyncio.Event().wait()
        except BaseExceptionGroup as failed:
            raise _first(failed) from None

    async def aclose(self) -> None:
        for connection in self.connections.values():
            with contextlib.suppress(Exception):
                await connection.disconnect()
        self.connections.clear()


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


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


async def refresh(cluster: StoreCluster) -> None:
    """Reload the slot table from the nodes the client knows, in a turn of the client's (it
    takes a connection of a node)."""
    async with cluster.turn():
        await cluster.initialize()
        await cluster.nodes_manager.initialize()


async def listen(
    redis: Redis,
    sharded: Callable[[], Collection[str]],
    on_message: Callable[[Message], None],
    *,
    name: str,
    broadcast: Callable[[], Collection[str]] = tuple,
    on_connect: Callable[[bool], None] | None = None,
    on_drop: Callable[[], None] | None = None,
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
    on_drop: Callable[[], None] | None = None,
    max_backoff: float = 1.0,
    broadcast: Callable[[], Collection[str]] = tuple,
) -> None:
    """``SSUBSCRIBE`` to ``channels()``, each on its shard, and ``SUBSCRIBE`` to ``broadcast()``
    on one node, and hand every message (subscribe confirmations included, typed as
    ``listen_forever`` types them) to ``on_message``, until cancelled. ``on_connect(after_drop)``
    runs once the subscriptions are sent; ``on_drop`` whenever they end. ``cluster`` is used for
    its slot table (rebuilt here after each failure) and its connection options; it may be
    shared (``StoreCluster`` keeps the connections of its nodes when its table is rebuilt)."""
    delay, lost = 0.1, False
    while True:
        stop_if_cancelled()  # a refresh below may have swallowed it
        shards = ShardSet(cluster)
        try:
            await shards.subscribe(channels(), broadcast())
            if lost:
                log.info("%s: subscriptions restored", name)
            if on_connect is not None:
                on_connect(lost)
            delay, lost = 0.1, False
            await shards.run(on_message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a shard lost, moved or not there yet
            raise_if_cancelled(exc)
            if not lost:
                log.warning("%s: a shard's subscription ended (%s); resubscribing", name, exc)
            lost = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_backoff)
            with contextlib.suppress(Exception):
                await refresh(cluster)
        finally:
            if on_drop is not None:
                on_drop()
            await shards.aclose()
