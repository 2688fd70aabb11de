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
SLOTS`` from the nodes it knows), with a backoff (0.1 s doubling up to ``max_backoff``) while
that fails: during a failover, until a replica is promoted (``cluster-node-timeout`` + about
1 s). As with ``listen_forever``, messages published while a channel is subscribed again are
lost: ``on_drop(channels)`` says which, and when that window opens; their confirmations, when
it closes.
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


class NotSubscribed(RedisConnectionError):
    """A connection that failed before its subscriptions were sent: nothing was dropped."""


def _by_node(cluster: StoreCluster, channels: Collection[str],
             broadcast: Collection[str]) -> list[tuple[ClusterNode, dict[int, list[str]], list[str]]]:
    """``channels`` by the primary of their slot, per the slot table now, each node's by slot (a
    command's channels must share one); the ``broadcast`` ones with the first node (or a random
    primary's when there are no others): a plain ``PUBLISH`` reaches every node of a cluster."""
    by_node: dict[str, tuple[ClusterNode, dict[int, list[str]], list[str]]] = {}
    for channel in channels:
        slot = cluster.keyslot(channel)
        node = cluster.nodes_manager.get_node_from_slot(slot)
        by_node.setdefault(node.name, (node, {}, []))[1].setdefault(slot, []).append(channel)
    if broadcast:
        if not by_node:
            node = cluster.get_random_node()
            by_node[node.name] = (node, {}, [])
        next(iter(by_node.values()))[2].extend(broadcast)
    return list(by_node.values())


async def _serve(node: ClusterNode, slots: dict[int, list[str]], broadcast: list[str],
                 on_message: Callable[[Message], None], on_connect: Callable[[bool], None] | None,
                 after_drop: bool) -> None:
    """One connection to ``node``: ``SSUBSCRIBE`` per slot, ``SUBSCRIBE`` to ``broadcast``, and
    every reply to ``on_message`` until it fails (raised). The connection is the cluster client's
    kind (its password, TLS and parser, which turns a ``MOVED`` reply into ``MovedError``) but
    not from its pools, and has no read timeout: a quiet channel is not a dead one."""
    connection = node.connection_class(**{**node.connection_kwargs, "socket_timeout": None})
    try:
        try:
            await connection.connect()
            for names in slots.values():
                await connection.send_command("SSUBSCRIBE", *names)
            if broadcast:
                await connection.send_command("SUBSCRIBE", *broadcast)
        except Exception as exc:  # a node dead, or not there yet
            raise_if_cancelled(exc)
            raise NotSubscribed(f"{node.name}: {exc}") from exc
        if on_connect is not None:
            on_connect(after_drop)
        await _read(node.name, connection, on_message)
    finally:
        with contextlib.suppress(Exception):
            await connection.disconnect()


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
    nothing, and is retried quietly). ``cluster`` is used for its slot table (rebuilt here after
    each failure) and its connection options; it may be shared (``StoreCluster`` keeps the
    connections of its nodes when its table is rebuilt)."""
    serving: dict[asyncio.Task[None], tuple[list[str], list[str]]] = {}  # each connection's channels
    waiting, plain = list(channels()), list(broadcast())  # not subscribed now
    delay, lost = 0.1, False
    loop = asyncio.get_running_loop()
    try:
        while True:
            stop_if_cancelled()  # a refresh below may have swallowed it
            if waiting or plain:
                try:
                    if lost:
                        await refresh(cluster)
                    else:
                        async with cluster.turn():  # the slot table's first load takes a node's connection
                            await cluster.initialize()
                    groups = _by_node(cluster, waiting, plain)
                except Exception as exc:  # no node answers yet
                    raise_if_cancelled(exc)
                    if not lost:
                        log.warning("%s: no slot table (%s); trying again", name, exc)
                    lost = True
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, max_backoff)
                    continue
                for node, slots, its_plain in groups:
                    sharded = [c for names in slots.values() for c in names]
                    task = asyncio.create_task(_serve(node, slots, its_plain, on_message, on_connect, lost))
                    serving[task] = (sharded, its_plain)
                waiting, plain = [], []
            if not serving:  # no channel at all
                await asyncio.Event().wait()
            since = loop.time()
            ended, _ = await asyncio.wait(serving, return_when=asyncio.FIRST_COMPLETED)
            if loop.time() - since > 5 * max_backoff:  # they had been up a while: a new episode
                delay = 0.1
            for task in ended:
                sharded, its_plain = serving.pop(task)
                waiting += sharded
                plain += its_plain
                if isinstance(task.exception(), NotSubscribed):
                    # Its channels were down already: said once, at the first attempt of an episode.
                    if delay == 0.1:
                        log.warning("%s: cannot subscribe (%s); trying again", name, task.exception())
                    continue
                log.warning("%s: a shard's subscription ended (%s); subscribing its %d channels again",
                            name, task.exception(), len(sharded) + len(its_plain))
                if on_drop is not None:
                    on_drop([*sharded, *its_plain])
            lost = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_backoff)
    finally:
        for task in serving:
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)
        if on_drop is not None and serving:
            on_drop([c for sharded, its_plain in serving.values() for c in (*sharded, *its_plain)])
