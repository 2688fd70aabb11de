"""Redis's memory against its ``maxmemory``: the reading admission refuses new work by.

Redis runs with ``maxmemory-policy noeviction``: at its ``maxmemory`` it refuses any write that
may grow memory rather than evict a key (an evicted job or record would break every guarantee).
Work already accepted must still settle there: its record, up to ``CARMY_MAX_RESULT_BYTES``, is
written after it was admitted. So new work stops first: admission refuses new calls
(``STORE_FULL``) once Redis uses all but a headroom of its ``maxmemory``
(``CARMY_REDIS_MEMORY_HEADROOM``, a fraction of it), and the scripts that carry accepted work on
may run over the limit (``lua.ACCEPTED_WORK``). A burst may outrun the reading, which is up to
``READ_EVERY_S`` old: at the limit itself, Redis refuses SUBMIT whole (``lua.NEW_WORK``), and
the refusal is the same.

Each API process takes the reading every ``READ_EVERY_S`` (``INFO memory``: microseconds of
Redis's time), not each call: ``INFO`` inside SUBMIT would cost Redis a millisecond a call.

On a Redis Cluster each primary holds some partitions and has its own ``maxmemory``, and any of
them may fill first (a partition's SUBMIT is refused by its own primary): the reading is every
primary's ``INFO``, sent at once, and admission goes by the fullest (``MemoryReading.fullest``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from msgspec import Struct
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from carmy_worker.store import version
from carmy_worker.store.cluster import StoreCluster
from carmy_worker.store.pubsub import raise_if_cancelled, stop_if_cancelled

log = logging.getLogger("carmy.store")

READ_EVERY_S = 0.5


class MemoryReading(Struct, frozen=True):
    """One reading of Redis's memory, in bytes."""

    used: int  # what Redis holds against maxmemory: used_memory, less its AOF and replication buffers
    limit: int  # maxmemory; 0: none, and new work is never refused for memory
    admit_below: int  # new work is admitted while ``used`` is below this: the limit less the headroom

    @classmethod
    def of(cls, info: dict[str, Any], headroom: float) -> MemoryReading:
        """From ``INFO memory``, with ``headroom`` (a fraction of ``maxmemory``) kept for the
        work already accepted."""
        limit = int(info.get("maxmemory", 0))
        # What Redis compares with maxmemory before a write (its getMaxmemoryState).
        used = int(info["used_memory"]) - int(info.get("mem_not_counted_for_evict", 0))
        return cls(used=used, limit=limit, admit_below=limit - int(limit * headroom))

    @property
    def full(self) -> bool:
        """New work is refused."""
        return self.limit > 0 and self.used >= self.admit_below

    @staticmethod
    def fullest(readings: list[MemoryReading]) -> MemoryReading:
        """Of several primaries' readings, the one admission goes by: a full one if any, else
        the one using the largest share of its limit (one without a limit last)."""
        return max(readings, key=lambda r: (r.full, r.used / r.limit if r.limit else -1.0))


class StoreMemory:
    """The latest reading of one API process, and what it has refused for memory."""

    def __init__(self, redis: Redis, *, headroom: float) -> None:
        self.redis = redis
        self.headroom = headroom
        self.reading: MemoryReading | None = None
        self.refusals = 0  # new calls this process refused because Redis was full
        self._overflowed = False  # Redis refused new work itself since the last reading

    @property
    def room(self) -> bool:
        """Whether new work may be admitted, as far as this process knows (until a first
        reading, Redis's own refusal of SUBMIT is the only limit)."""
        return not self._overflowed and (self.reading is None or not self.reading.full)

    async def read(self) -> MemoryReading:
        """A new reading, kept as the latest."""
        return self._keep(await self._infos("memory"))

    async def read_with_version(self) -> tuple[tuple[int, ...] | None, MemoryReading | None]:
        """For ``/ready``: Redis's version and a new reading, from one ``INFO`` (its default
        sections hold both; several named sections would be a syntax error to the Redis 6 the
        version check is for). Redis refusing INFO (an ACL): no version, and the last reading."""
        try:
            infos = await self._infos()
        except ResponseError:
            return None, self.reading
        found = [v for v in map(version.version_of, infos) if v is not None]
        return min(found, default=None), self._keep(infos)  # the oldest primary's: the one that fails

    async def _infos(self, section: str | None = None) -> list[dict[str, Any]]:
        """``INFO`` of the one Redis, or of every primary of a cluster (at once; the slot table
        loaded first, as ``cluster.held_connection`` does, so that every primary is known)."""
        if not isinstance(self.redis, StoreCluster):
            return [await self.redis.info(section)]
        await self.redis.initialize()
        primaries = self.redis.get_primaries()
        return list(await asyncio.gather(*(self.redis.info(section, target_nodes=node) for node in primaries)))

    def _keep(self, infos: list[dict[str, Any]]) -> MemoryReading:
        reading = MemoryReading.fullest([MemoryReading.of(info, self.headroom) for info in infos])
        if self.reading is None or reading.full != self.reading.full:
            _log_change(reading)
        self.reading, self._overflowed = reading, False
        return reading

    def refused(self, *, overflow: bool = False) -> None:
        """A new call was refused for memory; ``overflow``: by Redis itself, at its limit (no room
        until the next reading says otherwise)."""
        self.refusals += 1
        if overflow:
            self._overflowed = True

    async def run(self, interval: float = READ_EVERY_S) -> None:
        """Read every ``interval`` seconds until cancelled; a failed reading keeps the last one
        (Redis unreachable is another refusal's business)."""
        refused = False  # Redis refuses INFO (an ACL without it): said once
        while True:
            try:
                await self.read()
                stop_if_cancelled()
            except asyncio.CancelledError:
                raise
            except ResponseError as exc:
                if not refused:
                    log.warning("Redis refuses INFO (%s): new calls are refused for memory only at its maxmemory "
                                "itself, and the accepted ones may take it past it; allow INFO to keep a headroom",
                                exc)
                refused = True
            except Exception as exc:
                raise_if_cancelled(exc)
                log.debug("reading Redis's memory failed: %s", exc)
            await asyncio.sleep(interval)


def _log_change(reading: MemoryReading) -> None:
    if reading.full:
        log.warning("Redis uses %d of its %d bytes (maxmemory), less the headroom kept for accepted work: "
                    "new calls are refused (STORE_FULL) until memory frees", reading.used, reading.limit)
    elif reading.limit:
        log.info("Redis uses %d of its %d bytes (maxmemory): new calls are admitted", reading.used, reading.limit)
