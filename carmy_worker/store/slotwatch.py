"""Which primary serves a slot, as one node of a Redis Cluster says now (``CLUSTER SLOTS``), asked
by a caller that must not wait on a node that hangs: ``store.shardpubsub``'s listener, whose
subscribed connections have no reply timeout (a quiet channel is not a dead one), so that a
primary that hangs (a stopped process, a partition without a reset) ends none of them, and only
the table says its replica took over.

``SlotWatch`` asks on a connection of its own (never a turn of the cluster client's, nor its
slot table, which it leaves alone), one node at a time, each ask bounded by
``SLOTS_TIMEOUT_S``: a node that does not answer in time, or fails, is left for the next node the
client knows, at the next ask. It starts at a random one, so that the listeners of a deployment
do not all ask the same node. One ask is a few ranges to parse: cheap enough to make every
second.
"""

from __future__ import annotations

import asyncio
import bisect
import random
from typing import Any

from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection
from redis.cluster import get_node_name

from carmy_worker.store.cluster import SLOTS_TIMEOUT_S, StoreCluster
from carmy_worker.store.pubsub import raise_if_cancelled


class SlotTable:
    """``CLUSTER SLOTS`` as ranges of slots, each with its primary's name (``host:port``, as the
    cluster client names its nodes)."""

    __slots__ = ("_ends", "_ranges")

    def __init__(self, ranges: list[tuple[int, int, str]]) -> None:
        self._ranges = sorted(ranges)
        self._ends = [end for _, end, _ in self._ranges]

    def owner(self, slot: int) -> str | None:
        """The name of the primary serving ``slot``; None if none does."""
        i = bisect.bisect_left(self._ends, slot)
        if i < len(self._ranges) and self._ranges[i][0] <= slot:
            return self._ranges[i][2]
        return None


def parse(reply: list[Any], cluster: StoreCluster, asked: ClusterNode) -> SlotTable:
    """A ``CLUSTER SLOTS`` reply of ``asked`` (``[start, end, [host, port, id, ...], replicas...]``
    each), its primaries named as the client names them (its ``address_remap`` applied; an empty
    host is the asked node's, as redis-py has it)."""
    ranges = []
    for start, end, primary, *_ in reply:
        host = primary[0].decode() if isinstance(primary[0], bytes) else primary[0]
        host, port = cluster.nodes_manager.remap_host_port(host or asked.host, int(primary[1]))
        ranges.append((int(start), int(end), get_node_name(host, port)))
    return SlotTable(ranges)


class SlotWatch:
    """The slot table, asked of one node of ``cluster`` at a time (``table``)."""

    def __init__(self, cluster: StoreCluster) -> None:
        self.cluster = cluster
        self._turn = random.randrange(1 << 16)  # which node is asked: the one that answered last
        self._node: ClusterNode | None = None
        self._connection: AbstractConnection | None = None

    async def table(self) -> SlotTable | None:
        """The table as the node asked says it; None if it did not answer within
        ``SLOTS_TIMEOUT_S`` or failed (the next ask goes to another node)."""
        try:
            async with asyncio.timeout(SLOTS_TIMEOUT_S):
                node, connection = await self._connected()
                await connection.send_command("CLUSTER SLOTS")
                return parse(await connection.read_response(), self.cluster, node)
        except Exception as exc:  # a node that hangs, died, or is not a cluster's
            raise_if_cancelled(exc)
            await self.close()
            self._turn += 1
            return None

    async def _connected(self) -> tuple[ClusterNode, AbstractConnection]:
        if self._node is None or self._connection is None:
            nodes = sorted(self.cluster.nodes_manager.nodes_cache.values(), key=lambda node: node.name)
            if not nodes:
                raise LookupError("no node known yet")
            node = nodes[self._turn % len(nodes)]
            connection = node.connection_class(**node.connection_kwargs)
            self._node, self._connection = node, connection
            await connection.connect()
        return self._node, self._connection

    async def close(self) -> None:
        connection, self._node, self._connection = self._connection, None, None
        if connection is not None:
            try:
                await connection.disconnect(nowait=True)
            except Exception as exc:
                raise_if_cancelled(exc)
