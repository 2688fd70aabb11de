"""Settling what nobody else will: executions whose worker died, and executions that waited in
the queue past their start deadline. Every worker and every API process runs one; the scripts
make concurrent janitors harmless."""

from __future__ import annotations

import asyncio
import logging

from msgspec import Struct
from redis.asyncio import Redis

from carmy_worker.settings import AuditSettings
from carmy_worker.store import jobs, keys
from carmy_worker.store.audit import AuditTrail
from carmy_worker.store.durable import Durability
from carmy_worker.store.lua import ACCEPTED_WORK, NOW
from carmy_worker.store.pubsub import raise_if_cancelled, stop_if_cancelled
from carmy_worker.store.roster import CUTOFF
from carmy_worker.store.scripts import Script, bind
from carmy_worker.store.verdicts import Verdicts

log = logging.getLogger("carmy.janitor")

# Tools of a worker that left are still listed (as NO_WORKERS) this long, so a restart or a
# crash does not turn calls into TOOL_NOT_FOUND.
DEPARTED_MEMORY_S = 3600

# What the janitor has to look at: executions claimed by dead workers (REAP decides each),
# executions that were never started in time. Jobs a dead worker leased but never claimed go
# back to the queue here and now. Forgets workers that departed more than `memory` ms ago.
# KEYS: watch, workers zset, queued zset, draining set
# ARGV: dead after ms, memory ms, running prefix, execution prefix, worker prefix, leases prefix,
#       in-progress prefix
JANITOR_SCAN = Script("JANITOR_SCAN", ACCEPTED_WORK + NOW + CUTOFF + jobs.DUE_AGAIN + """
local dead_before = cutoff(now, tonumber(ARGV[1]))
local held, released = {}, {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. dead_before)) do
  local running = ARGV[3] .. id
  for _, e in ipairs(redis.call('SMEMBERS', running)) do
    table.insert(held, id)
    table.insert(held, e)
    table.insert(held, redis.call('HGET', ARGV[4] .. e, 'tool') or '')
  end
  local leases = redis.call('HGETALL', ARGV[6] .. id)
  for i = 1, #leases, 2 do
    local job, token = leases[i], leases[i + 1]
    if redis.call('SISMEMBER', running, job) == 0 then
      if redis.call('GET', ARGV[7] .. job) == token then
        redis.call('DEL', ARGV[7] .. job)
        local wake = redis.call('HGET', ARGV[4] .. job, 'wake')
        if wake then due_again(wake, job) end
        table.insert(released, job)
      end
      redis.call('HDEL', ARGV[6] .. id, job)
    end
  end
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[2]))) do
  if redis.call('SCARD', ARGV[3] .. id) == 0 then
    redis.call('DEL', ARGV[5] .. id, ARGV[6] .. id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('SREM', KEYS[4], id)
  end
end
local late = {}
for _, e in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)) do
  table.insert(late, e)
  table.insert(late, redis.call('HGET', ARGV[4] .. e, 'tool') or '')
end
return {held, late, released}
""")


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
    released: list[str]  # jobs a dead worker leased and never claimed, back in the queue


class Janitor:
    def __init__(self, redis: Redis, *, retention: int, dead_after: float,
                 durability: Durability | None = None, audit: AuditSettings | None = None) -> None:
        self.dead_after_ms = int(dead_after * 1000)
        self._scan = bind(redis, JANITOR_SCAN)
        self._verdicts = Verdicts(redis, retention=retention, durability=durability)
        # The audit trail's bounds, kept by every janitor (store.audit: its scripts never trim).
        self._audit = AuditTrail(redis)
        self._audit_bounds = audit or AuditSettings()

    async def run(self, interval: float = 1.0) -> None:
        """Sweep every ``interval`` seconds until cancelled; Redis errors are retried."""
        while True:
            try:
                await self.sweep()
                stop_if_cancelled()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise_if_cancelled(exc)
                log.debug("janitor sweep failed: %s", exc)
            await asyncio.sleep(interval)

    async def scan(self) -> Scan:
        """JANITOR_SCAN: what is held by dead workers and what is late (forgetting long-departed workers)."""
        held, late, released = await self._scan(
            keys=[keys.WATCH, keys.WORKERS, keys.QUEUED, keys.DRAINING],
            args=[self.dead_after_ms, DEPARTED_MEMORY_S * 1000, keys.running("", 0), keys.execution(""),
                  keys.worker(""), keys.leases("", 0), jobs.in_progress_key_prefix(0)],
        )
        return Scan(
            held=[Held(*(v.decode() for v in held[i:i + 3])) for i in range(0, len(held), 3)],
            late=[Late(*(v.decode() for v in late[i:i + 2])) for i in range(0, len(late), 2)],
            released=[job.decode() for job in released],
        )

    async def sweep(self) -> int:
        """One pass; returns how many executions it settled or re-queued."""
        found = await self.scan()
        for h in found.held:
            outcome = await self._verdicts.reap(h.execution_id, h.tool, worker_id=h.worker_id,
                                                why="its worker stopped responding")
            log.warning("execution %s of dead worker %s: %s", h.execution_id, h.worker_id, outcome)
        for job in found.released:
            log.warning("job %s, leased by a dead worker and never started, is back in the queue", job)
        acted = len(found.held) + len(found.released)
        for late in found.late:
            if await self._verdicts.expire_unstarted(late.execution_id, late.tool):
                log.warning("execution %s never started before its deadline", late.execution_id)
                acted += 1
        await self._audit.trim(max_entries=self._audit_bounds.max_entries, retention_s=self._audit_bounds.retention)
        return acted
