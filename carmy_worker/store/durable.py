"""Writes that a failover must not lose: a script call followed by ``WAIT`` for replicas.

Redis replicates asynchronously: a primary that dies can take its last writes with it, and the
replica promoted in its place never had them. For the writes Carmy's answers stand on (SUBMIT's
idempotency key, CLAIM's attempt, a final record), ``CARMY_REDIS_WAIT_REPLICAS`` > 0 makes the
writer wait until that many replicas have them (``WAIT``, on the same connection, in the same
round trip). When the replicas do not answer within ``CARMY_REDIS_WAIT_TIMEOUT`` ms the write
stands on the primary alone and the caller goes on (a warning says so): the answer is still
right, unless the primary fails before a replica catches up. A script bound with a
``Durability`` (``store.scripts.bind``) is run that way by ``store.scripts.run``.

On a Redis Cluster each shard has its own replicas, and ``WAIT`` counts those of the node it is
sent to: it must follow the script on the connection that ran it, one of the primary of the
script's slot (``run_durable_on_node``), never go where a cluster client sends a keyless command.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from redis.exceptions import ClusterDownError, NoScriptError, ResponseError

from carmy_worker.store.cluster import CLUSTER_RETRIES, REDIRECTED, StoreCluster, held_connection

if TYPE_CHECKING:
    from carmy_worker.store.scripts import Script

log = logging.getLogger("carmy.store")

# A node that refused the script (nothing ran) is asked again after this, the slot table reloaded.
REFUSED_PAUSE_S = 0.05


class Durability:
    """How many replicas the writes that matter wait for, and how long (one per process)."""

    def __init__(self, replicas: int = 0, timeout_ms: int = 500) -> None:
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self._short = False  # the last WAIT fell short: warn once per episode, not per write

    def acknowledged(self, acked: int) -> None:
        short = acked < self.replicas
        if short and not self._short:
            log.warning("writes reach %d of the %d replicas asked for (CARMY_REDIS_WAIT_REPLICAS) within %d ms; "
                        "going on without them", acked, self.replicas, self.timeout_ms)
        elif self._short and not short:
            log.info("writes reach %d replicas again", acked)
        self._short = short


async def run_durable_on_node(cluster: StoreCluster, script: Script, keys: list[Any], args: list[Any],
                              durability: Durability) -> Any:
    """``script`` then ``WAIT`` on one connection of its slot's primary, in one round trip. A
    refusal (``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``: the slot is elsewhere or moving,
    nothing ran) reloads the slot table and sends both again, ``CLUSTER_RETRIES`` times; a
    ``NOSCRIPT`` loads the script on that primary first (``StoreCluster.load_script_for``: not
    on every primary, one of which may be down). A connection error is the caller's: the script
    may have run."""
    for _ in range(CLUSTER_RETRIES):
        async with held_connection(cluster, keys[0]) as conn:
            await conn.send_packed_command(conn.pack_commands([
                script.command(keys, args), ("WAIT", durability.replicas, durability.timeout_ms)]))
            try:
                reply = await conn.read_response()
            except ResponseError as exc:  # the script's or the node's error, read whole
                reply = exc
            acked = await conn.read_response()
        if isinstance(reply, NoScriptError):
            await cluster.load_script_for(keys[0], script.source)
        elif isinstance(reply, REDIRECTED):
            cluster.reload_slots()
            await asyncio.sleep(REFUSED_PAUSE_S)
        elif isinstance(reply, Exception):
            raise reply
        else:
            durability.acknowledged(int(acked))
            return reply
    raise ClusterDownError(f"script {script.name}: its slot's primary refused it {CLUSTER_RETRIES} times")
