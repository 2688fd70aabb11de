"""Settling what nobody else will: executions whose worker died, and executions that waited in
the queue past their start deadline. Every worker and every API process runs one, over every
partition each sweep (each partition judges its workers by its own roster); the scripts make
concurrent janitors harmless."""

from __future__ import annotations

import asyncio
import logging

from msgspec import Struct
from redis.asyncio import Redis

from carmy_worker.failures import Failures
from carmy_worker.settings import AuditSettings
from carmy_worker.store import jobs, keys
from carmy_worker.store.audit import AuditTrail
from carmy_worker.store.durable import Durability
from carmy_worker.store.fanout import Call, run_each_reaching
from carmy_worker.store.groups import GONE, Groups
from carmy_worker.store.lua import ACCEPTED_WORK, NOW
from carmy_worker.store.pubsub import raise_if_cancelled, stop_if_cancelled
from carmy_worker.store.roster import CUTOFF
from carmy_worker.store.scripts import Script
from carmy_worker.store.verdicts import Verdicts

log = logging.getLogger("carmy.janitor")

# Tools of a worker that left are still listed (as NO_WORKERS) this long, so a restart or a
# crash does not turn calls into TOOL_NOT_FOUND. A group no worker has served for as long is gone
# (store.groups).
DEPARTED_MEMORY_S = 3600

# What the janitor has to look at in one partition: its executions claimed by workers dead by
# its roster (REAP decides each), its executions that were never started in time. Jobs a dead
# worker leased there but never claimed go back to the queue here and now. Forgets workers that
# departed more than `memory` ms ago (their info too, in partition 0, the info's: ARGV[5] is ''
# elsewhere), and names the groups no worker has marked for as long (store.groups). Every key is
# the partition's: declared, or named from its prefixes, in its slot.
# KEYS: watch, workers zset, queued zset, draining set, groups zset
# ARGV: dead after ms, memory ms, running prefix, execution prefix, worker info prefix or '',
#       leases prefix, in-progress prefix
JANITOR_SCAN = Script("JANITOR_SCAN", ACCEPTED_WORK + NOW + CUTOFF + jobs.DUE_AGAIN + GONE + """
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
    if ARGV[5] ~= '' then redis.call('DEL', ARGV[5] .. id) end
    redis.call('DEL', ARGV[6] .. id)
    redis.call('ZREM', KEYS[2], id)
    redis.call('SREM', KEYS[4], id)
  end
end
local late = {}
for _, e in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)) do
  local h = redis.call('HMGET', ARGV[4] .. e, 'tool', 'reaped')
  table.insert(late, e)
  table.insert(late, h[1] or '')
  table.insert(late, h[2] or '')
end
return {held, late, released, gone(KEYS[5], tonumber(ARGV[2]))}
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
    reaped: str  # the attempt REAP took back when it put the execution back in the queue, or ''


class Gone(Struct):
    """A group no worker has served in a partition for the janitor's memory, as of its ``mark``."""

    group: str
    partition: int
    mark: bytes


class Scan(Struct):
    held: list[Held]
    late: list[Late]
    released: list[str]  # jobs a dead worker leased and never claimed, back in the queue
    gone: list[Gone] = []


class Janitor:
    def __init__(self, redis: Redis, *, retention: int, dead_after: float,
                 durability: Durability | None = None, audit: AuditSettings | None = None,
                 memory: float = DEPARTED_MEMORY_S) -> None:
        self.dead_after_ms = int(dead_after * 1000)
        self.memory_ms = int(memory * 1000)  # departed workers and gone groups are forgotten after it
        self._redis = redis
        self._verdicts = Verdicts(redis, retention=retention, durability=durability)
        self._groups = Groups(redis, memory_ms=self.memory_ms)
        # The audit trail's bounds, kept by every janitor (store.audit: its scripts never trim).
        self._audit = AuditTrail(redis)
        self._audit_bounds = audit or AuditSettings()
        self._failures = Failures("janitor sweep", log)

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
                self._failures.failed(exc)
            else:
                self._failures.worked()
            await asyncio.sleep(interval)

    async def scan(self) -> Scan:
        """JANITOR_SCAN in every partition (one pipeline; one call each, in every partition that
        answers, when a cluster's primary is down): what is held by workers dead by that
        partition's roster and what is late there (forgetting long-departed workers)."""
        # A cluster's pipeline fails as a whole when one of its primaries is down: then each
        # partition alone, so that those of the primaries that are up are still swept.
        calls = [self._scan_call(p) for p in keys.partitions()]
        answered = zip(keys.partitions(), await run_each_reaching(self._redis, JANITOR_SCAN, calls), strict=True)
        replies = {p: reply for p, reply in answered if not isinstance(reply, Exception)}
        held = [v.decode() for reply in replies.values() for v in reply[0]]
        late = [v.decode() for reply in replies.values() for v in reply[1]]
        return Scan(
            held=[Held(*held[i:i + 3]) for i in range(0, len(held), 3)],
            late=[Late(*late[i:i + 3]) for i in range(0, len(late), 3)],
            released=[job.decode() for reply in replies.values() for job in reply[2]],
            gone=[Gone(reply[3][i].decode(), p, reply[3][i + 1]) for p, reply in replies.items()
                  for i in range(0, len(reply[3]), 2)],
        )

    def _scan_call(self, partition: int) -> Call:
        return ([keys.watch(partition), keys.workers(partition), keys.queued(partition), keys.draining(partition),
                 keys.groups(partition)],
                [self.dead_after_ms, self.memory_ms, keys.running("", partition),
                 keys.execution_prefix(partition), keys.worker("") if partition == 0 else "",
                 keys.leases("", partition), jobs.in_progress_key_prefix(partition)])

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
            if await self._verdicts.expire_unstarted(late.execution_id, late.tool, requeued=bool(late.reaped)):
                log.warning("execution %s never started%s before its deadline", late.execution_id,
                            " again" if late.reaped else "")
                acted += 1
        await self._audit.trim(max_entries=self._audit_bounds.max_entries, retention_s=self._audit_bounds.retention)
        for gone in found.gone:
            forgetting = await self._groups.forget(gone.group, gone.partition, gone.mark)
            if forgetting.forgotten:
                log.info("group %s: no worker serves it, its queue in partition %d is forgotten", gone.group,
                         gone.partition)
            for exec_id, tool in forgetting.stranded:
                if await self._verdicts.expire_abandoned(exec_id, tool):
                    log.warning("execution %s was queued for group %s, which no worker serves any more: "
                                "settled TIMEOUT", exec_id, gone.group)
                    acted += 1
        return acted
