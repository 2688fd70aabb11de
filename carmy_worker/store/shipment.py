"""Shipping the audit trail out of Redis (``CARMY_AUDIT_SINK``): each entry of ``keys.AUDIT`` to
exactly one API process, whichever of them reads it first, through one Redis consumer group.

The group is created at the stream's end (``$``) the first time an API with a sink starts:
what was written before is not shipped. From then on Redis remembers where the group stands, so
entries written while no API runs are read by the next one to start. An entry stays pending
for its consumer until acknowledged (``ack``, once its line is written); a consumer that died
before that leaves it pending, and another takes it over once it has been idle
``CLAIM_IDLE_MS`` (``claim_stale``). Entries trimmed before anyone read them are gone, and so
are those trimmed while pending (XAUTOCLAIM drops them from the group).

One ``Shipment`` per process, on a client of its own: ``read`` blocks a connection for up to
``block_ms``, which the API's bounded pool must never lend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from carmy_worker.store import keys
from carmy_worker.store.audit import decode
from carmy_worker.wire import AuditEntry

GROUP = "carmy-sink"  # the consumer group every API process's sink reads the trail in
CLAIM_IDLE_MS = 30_000  # an entry pending this long belongs to a consumer that died (or hung)
# A consumer with nothing pending, idle this long, is a process gone: forgotten, so that the
# group does not keep a name per restart forever.
FORGET_IDLE_MS = 3_600_000


@dataclass(frozen=True)
class Lot:
    """Entries read for one consumer: those still in the trail, and the ids of those trimmed
    before they were shipped (to acknowledge: they cannot be shipped any more)."""

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

    async def join(self) -> None:
        """Create the group at the trail's end (and the stream with it) unless it exists."""
        try:
            await self.redis.xgroup_create(keys.AUDIT, GROUP, id="$", mkstream=True)
        except ResponseError as exc:
            if not str(exc).startswith("BUSYGROUP"):
                raise

    async def pending(self, count: int) -> Lot:
        """Up to ``count`` entries this consumer was given and never acknowledged (a line that
        could not be written), oldest first."""
        return self._lot(await self.redis.xreadgroup(GROUP, self.consumer, {keys.AUDIT: "0"}, count=count))

    async def read(self, count: int, block_ms: int) -> Lot:
        """Up to ``count`` entries no consumer was given yet, waiting up to ``block_ms`` for one."""
        return self._lot(await self.redis.xreadgroup(GROUP, self.consumer, {keys.AUDIT: ">"}, count=count,
                                                     block=block_ms))

    async def claim_stale(self, count: int) -> Lot:
        """Up to ``count`` entries other consumers were given and left idle over ``CLAIM_IDLE_MS``,
        now this consumer's (XAUTOCLAIM drops those trimmed meanwhile from the group itself)."""
        reply = await self.redis.xautoclaim(keys.AUDIT, GROUP, self.consumer, CLAIM_IDLE_MS, "0-0", count=count)
        return Lot(_entries(reply[1]), [])

    async def ack(self, ids: list[str]) -> None:
        """These entries are shipped: no consumer is given them again."""
        if ids:
            await self.redis.xack(keys.AUDIT, GROUP, *ids)

    async def forget_gone_consumers(self, idle_ms: int = FORGET_IDLE_MS) -> int:
        """Remove the other consumers with nothing pending that have been idle ``idle_ms``: the
        names of processes that stopped. How many were removed."""
        forgotten = 0
        for consumer in await self.redis.xinfo_consumers(keys.AUDIT, GROUP):
            name = _text(consumer["name"])
            if name != self.consumer and int(consumer["pending"]) == 0 and int(consumer["idle"]) > idle_ms:
                await self.redis.xgroup_delconsumer(keys.AUDIT, GROUP, name)
                forgotten += 1
        return forgotten

    @staticmethod
    def _lot(reply: Any) -> Lot:
        raw = [item for _stream, items in (reply or []) for item in items]
        return Lot(_entries(raw), [_text(entry_id) for entry_id, fields in raw if entry_id is not None and not fields])


def _entries(raw: list[Any]) -> list[AuditEntry]:
    # A pending entry trimmed from the stream comes back without fields (None): nothing to ship.
    return [decode(entry_id, fields) for entry_id, fields in raw if entry_id is not None and fields]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
