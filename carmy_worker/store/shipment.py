"""Shipping the audit trail out of Redis (``CARMY_AUDIT_SINK``): each entry of the trail to
exactly one API process, whichever of them reads it first, through one Redis consumer group on
each partition's stream (``keys.audit``).

The group is created at each stream's end (``$``) the first time an API with a sink starts:
what was written before is not shipped. From then on Redis remembers where the group stands, so
entries written while no API runs are read by the next one to start. An entry stays pending
for its consumer until acknowledged (``ack``, once its line is written); a consumer that died
before that leaves it pending, and another takes it over once it has been idle
``CLAIM_IDLE_MS`` (``claim_stale``). Entries trimmed before anyone read them are gone, and so
are those trimmed while pending (XAUTOCLAIM drops them from the group).

**Partitions.** A read names every partition's stream. On one Redis that is one XREADGROUP
over all of them (blocking until any has a new entry); a cluster refuses a command over keys
in several slots, so there it is one XREADGROUP per partition: first without blocking, and only
when none had anything, again blocking (each up to ``block_ms``, together). Entries carry their
id in the trail (``audit.trail_id``), which names their partition: ``ack`` sends each partition
its own.

One ``Shipment`` per process, on a client of its own: ``read`` blocks a connection (one per
partition on a cluster) for up to ``block_ms``, which the API's bounded pool must never lend.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from carmy_worker.store import keys
from carmy_worker.store.audit import decode, stream_id, trail_id
from carmy_worker.wire import AuditEntry

GROUP = "carmy-sink"  # the consumer group every API process's sink reads the trail in
CLAIM_IDLE_MS = 30_000  # an entry pending this long belongs to a consumer that died (or hung)
# A consumer with nothing pending, idle this long, is a process gone: forgotten, so that the
# group does not keep a name per restart forever.
FORGET_IDLE_MS = 3_600_000


@dataclass(frozen=True)
class Lot:
    """Entries read for one consumer: those still in the trail, and the ids (in the trail) of
    those trimmed before they were shipped (to acknowledge: they cannot be shipped any more)."""

    entries: list[AuditEntry]
    gone: list[str]

    @property
    def ids(self) -> list[str]:
        return [entry.id for entry in self.entries] + self.gone


def group_lost(exc: ResponseError) -> bool:
    """Whether Redis refused a read because the group (or the stream) is not there any more:
    a Redis that restarted without its data, or someone deleted the key."""
    text = str(exc)
    return text.startswith("NOGROUP") or "no longer exists" in text


class Shipment:
    """The reads and acknowledgements of one consumer (``consumer``: unique per process) of the
    sink's group."""

    def __init__(self, redis: Redis, consumer: str) -> None:
        self.redis = redis
        self.consumer = consumer
        # The streams each read names together: all at once, or one by one on a cluster.
        streams = [keys.audit(partition) for partition in keys.partitions()]
        self._reads = [[stream] for stream in streams] if isinstance(redis, RedisCluster) else [streams]

    async def join(self) -> None:
        """Create the group at each stream's end (and the stream with it) unless it exists."""
        for partition in keys.partitions():
            try:
                await self.redis.xgroup_create(keys.audit(partition), GROUP, id="$", mkstream=True)
            except ResponseError as exc:
                if not str(exc).startswith("BUSYGROUP"):
                    raise

    async def pending(self, count: int) -> Lot:
        """Up to ``count`` entries of each partition this consumer was given and never
        acknowledged (a line that could not be written), oldest first in each."""
        return await self._read("0", count, None)

    async def read(self, count: int, block_ms: int) -> Lot:
        """Up to ``count`` entries of each partition no consumer was given yet, waiting up to
        ``block_ms`` for one."""
        if len(self._reads) == 1:
            return await self._read(">", count, block_ms)
        lot = await self._read(">", count, None)
        return lot if lot.ids else await self._read(">", count, block_ms)

    async def claim_stale(self, count: int) -> Lot:
        """Up to ``count`` entries of each partition other consumers were given and left idle
        over ``CLAIM_IDLE_MS``, now this consumer's (XAUTOCLAIM drops those trimmed meanwhile
        from the group itself)."""
        replies = await asyncio.gather(*(
            self.redis.xautoclaim(keys.audit(p), GROUP, self.consumer, CLAIM_IDLE_MS, "0-0", count=count)
            for p in keys.partitions()))
        return Lot([e for p, reply in enumerate(replies) for e in _entries(reply[1], p)], [])

    async def ack(self, ids: list[str]) -> None:
        """These entries (ids in the trail) are shipped: no consumer is given them again."""
        by_partition: dict[int, list[str]] = defaultdict(list)
        for entry_id in ids:
            partition, in_stream = stream_id(entry_id)
            by_partition[partition].append(in_stream)
        for partition, in_stream_ids in by_partition.items():
            await self.redis.xack(keys.audit(partition), GROUP, *in_stream_ids)

    async def forget_gone_consumers(self, idle_ms: int = FORGET_IDLE_MS) -> int:
        """Remove, from each partition's group, the other consumers with nothing pending there
        that have been idle ``idle_ms``: the names of processes that stopped. How many names
        were removed."""
        forgotten = 0
        for partition in keys.partitions():
            stream = keys.audit(partition)
            for consumer in await self.redis.xinfo_consumers(stream, GROUP):
                name = _text(consumer["name"])
                if name != self.consumer and int(consumer["pending"]) == 0 and int(consumer["idle"]) > idle_ms:
                    await self.redis.xgroup_delconsumer(stream, GROUP, name)
                    forgotten += 1
        return forgotten

    async def _read(self, since: str, count: int, block_ms: int | None) -> Lot:
        replies = await asyncio.gather(*(
            self.redis.xreadgroup(GROUP, self.consumer, dict.fromkeys(streams, since), count=count, block=block_ms)
            for streams in self._reads))
        entries: list[AuditEntry] = []
        gone: list[str] = []
        for stream, items in (item for reply in replies for item in (reply or [])):
            partition = keys.partition_of_key(_text(stream))
            entries += _entries(items, partition)
            gone += [trail_id(entry_id, partition) for entry_id, fields in items if entry_id is not None and not fields]
        return Lot(entries, gone)


def _entries(raw: list[Any], partition: int) -> list[AuditEntry]:
    # A pending entry trimmed from the stream comes back without fields (None): nothing to ship.
    return [decode(entry_id, fields, partition) for entry_id, fields in raw if entry_id is not None and fields]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
