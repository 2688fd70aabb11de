"""Who serves: each worker's HEARTBEAT on Redis's clock, and the ``Roster`` (WORKERS) that the
API, the health check and the janitor judge liveness by."""

from __future__ import annotations

from typing import Any

import redis as sync_redis
from msgspec import Struct
from redis.asyncio import Redis

from carmy_worker.store import keys
from carmy_worker.store.lua import NOW

# Returns whether the worker's info is still there (a Redis that restarted empty has lost it,
# and the worker must publish it again).
# KEYS: workers zset, worker info; ARGV: worker_id, offset ms (0 alive; negative marks it departed)
HEARTBEAT = NOW + """
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return redis.call('EXISTS', KEYS[2])
"""

# Everything the API needs to know who serves what: {now, {id, score, ...}, {draining ids}}.
# KEYS: workers zset, draining set
WORKERS = NOW + """
return {now, redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES'), redis.call('SMEMBERS', KEYS[2])}
"""


class Roster(Struct, frozen=True):
    """Who heartbeats, as of Redis's clock."""

    now: int
    last_seen: dict[str, float]
    draining: frozenset[str]

    @classmethod
    def parse(cls, reply: list[Any]) -> Roster:
        pairs = reply[1]
        return cls(
            now=int(reply[0]),
            last_seen={pairs[i].decode(): float(pairs[i + 1]) for i in range(0, len(pairs), 2)},
            draining=frozenset(w.decode() for w in reply[2]),
        )

    def alive(self, worker_id: str, dead_after: float) -> bool:
        return self.last_seen.get(worker_id, 0) >= self.now - dead_after * 1000

    def serving(self, worker_id: str, dead_after: float) -> bool:
        """Alive and taking new work."""
        return worker_id not in self.draining and self.alive(worker_id, dead_after)


def _heartbeat_keys(worker_id: str) -> list[str]:
    return [keys.WORKERS, keys.worker(worker_id)]


_ROSTER_KEYS = [keys.WORKERS, keys.DRAINING]


class Liveness:
    """HEARTBEAT and WORKERS on an asyncio client."""

    def __init__(self, redis: Redis) -> None:
        self._heartbeat = redis.register_script(HEARTBEAT)
        self._workers = redis.register_script(WORKERS)

    async def heartbeat(self, worker_id: str, *, offset_ms: int = 0) -> bool:
        """Mark ``worker_id`` seen now (plus ``offset_ms``); False if Redis has lost its info."""
        return bool(await self._heartbeat(keys=_heartbeat_keys(worker_id), args=[worker_id, offset_ms]))

    async def roster(self) -> Roster:
        return Roster.parse(await self._workers(keys=_ROSTER_KEYS))


class SyncLiveness:
    """The same on a blocking client: for the heartbeat thread and the container health check."""

    def __init__(self, redis: sync_redis.Redis) -> None:
        self._heartbeat = redis.register_script(HEARTBEAT)
        self._workers = redis.register_script(WORKERS)

    def heartbeat(self, worker_id: str, *, offset_ms: int = 0) -> bool:
        return bool(self._heartbeat(keys=_heartbeat_keys(worker_id), args=[worker_id, offset_ms]))

    def roster(self) -> Roster:
        return Roster.parse(self._workers(keys=_ROSTER_KEYS))
