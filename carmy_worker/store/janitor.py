"""Settling what nobody else will: executions whose worker died, and executions that waited in
the queue past their start deadline. Every worker and every API process runs one; the scripts
make concurrent janitors harmless."""

from __future__ import annotations

import asyncio
import logging

from msgspec import Struct
from redis.asyncio import Redis

from carmy_worker.store import keys
from carmy_worker.store.durable import Durability
from carmy_worker.store.lua import NOW
from carmy_worker.store.pubsub import raise_if_cancelled
from carmy_worker.store.verdicts import Verdicts

log = logging.getLogger("carmy.janitor")

# Tools of a worker that left are still listed (as NO_WORKERS) this long, so a restart or a
# crash does not turn calls into TOOL_NOT_FOUND.
DEPARTED_MEMORY_S = 3600

# What the janitor has to look at: executions held by dead workers, executions that were
# never started in time. Forgets workers that departed more than `memory` ms ago.
# KEYS: workers zset, queued zset, draining set
# ARGV: dead after ms, memory ms, running prefix, execution prefix, worker prefix
JANITOR_SCAN = NOW + """
local held = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]))) do
  for _, e in ipairs(redis.call('SMEMBERS', ARGV[3] .. id)) do
    table.insert(held, id)
    table.insert(held, e)
    table.insert(held, redis.call('HGET', ARGV[4] .. e, 'tool') or '')
  end
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))) do
  if redis.call('SCARD', ARGV[3] .. id) == 0 then
    redis.call('DEL', ARGV[5] .. id)
    redis.call('ZREM', KEYS[1], id)
    redis.call('SREM', KEYS[3], id)
  end
end
local late = {}
for _, e in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 100)) do
  table.insert(late, e)
  table.insert(late, redis.call('HGET', ARGV[4] .. e, 'tool') or '')
end
return {held, late}
"""


class Held(Struct):
    """An execution still listed as running on a worker that stopped heartbeating."""

    worker_id: str
    execution_id: str
    tool: str


class Late(Struct):
    """An execution still queued past its start-by instant."""

    execution_id: str
    tool: str


class Scan(Struct):
    held: list[Held]
    late: list[Late]


class Janitor:
    def __init__(self, redis: Redis, *, retention: int, dead_after: float,
                 durability: Durability | None = None) -> None:
        self.dead_after_ms = int(dead_after * 1000)
        self._scan = redis.register_script(JANITOR_SCAN)
        self._verdicts = Verdicts(redis, retention=retention, durability=durability)

    async def run(self, interval: float = 1.0) -> None:
        """Sweep every ``interval`` seconds until cancelled; Redis errors are retried."""
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise_if_cancelled(exc)
                log.debug("janitor sweep failed: %s", exc)
            await asyncio.sleep(interval)

    async def scan(self) -> Scan:
        """JANITOR_SCAN: what is held by dead workers and what is late (forgetting long-departed workers)."""
        held, late = await self._scan(
            keys=[keys.WORKERS, keys.QUEUED, keys.DRAINING],
            args=[self.dead_after_ms, DEPARTED_MEMORY_S * 1000, keys.running(""), keys.execution(""), keys.worker("")],
        )
        return Scan(
            held=[Held(*(v.decode() for v in held[i:i + 3])) for i in range(0, len(held), 3)],
            late=[Late(*(v.decode() for v in late[i:i + 2])) for i in range(0, len(late), 2)],
        )

    async def sweep(self) -> int:
        """One pass; returns how many executions it settled or re-queued."""
        found = await self.scan()
        for h in found.held:
            outcome = await self._verdicts.reap(h.execution_id, h.tool, worker_id=h.worker_id,
                                                why="its worker stopped responding")
            log.warning("execution %s of dead worker %s: %s", h.execution_id, h.worker_id, outcome)
        acted = len(found.held)
        for late in found.late:
            if await self._verdicts.expire_unstarted(late.execution_id, late.tool):
                log.warning("execution %s never started before its deadline", late.execution_id)
                acted += 1
        return acted
