"""Records imposed on an execution by someone other than the attempt that runs it: a caller's
CANCEL, the janitor's REAP of an execution whose worker died (or a worker giving one back as it
stops), and EXPIRE_UNSTARTED for one that waited in the queue past its start-by instant (SUBMIT's,
or the one REAP gave it when it put it back)."""

from __future__ import annotations

from typing import Literal, cast

from redis.asyncio import Redis

from carmy_worker.store import jobs, keys, metrics, records
from carmy_worker.store.durable import Durability
from carmy_worker.store.lua import ACCEPTED_WORK, IMPOSE, LOSE, NOW, text
from carmy_worker.store.scripts import Script, bind
from carmy_worker.wire import Record, final_event

# Cancels an execution for its caller. One never started is settled here and now; a running
# one is signalled to every worker (the one running it answers with the record).
# KEYS: exe, record, pending, queued, jobs' settled executions, audit trail, the partition's counts
# ARGV: exec_id, record, retention s, events channel, final event, cancel channel, metrics label
CANCEL = Script("CANCEL", ACCEPTED_WORK + IMPOSE + """
if redis.call('EXISTS', KEYS[2]) == 1 then return 'settled' end
if redis.call('EXISTS', KEYS[1]) == 0 then return 'gone' end
redis.call('HSET', KEYS[1], 'cancel', 1)
if redis.call('HGET', KEYS[1], 'state') == 'running' then
  redis.call('SPUBLISH', ARGV[6], ARGV[1])
  return 'signalled'
end
redis.call('ZREM', KEYS[4], ARGV[1])
impose(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[7], KEYS[5], KEYS[6], KEYS[7])
return 'cancelled'
""")

# An execution whose worker stopped heartbeating (or lost track of it: ARGV[8] then names the
# attempt that must still be current). Its arq lease (the in-progress key, if still the one the
# worker took) is dropped, its job due again at once and one idle worker woken, so a live worker
# takes it now instead of when the lease ends: an idempotent execution simply runs again, and so
# does one whose tool no attempt began (it was waiting for its lock); any other is settled
# uncertain first, so the re-delivered job finds it settled and never runs the tool a second
# time (so is one whose job is gone: nothing could run it again).
# The worker loses it in its set of losses (lua.LOSE), for its heartbeat if it is only paused.
# One put back waits again as one SUBMIT queued does, for as long as SUBMIT gave it (its start-by
# less when it was queued, or last put back), from now: back in the queued set with that start-by,
# so that the janitor settles it (EXPIRE_UNSTARTED) if no worker starts it again in time, as when
# its group's last worker was the one that died.
# KEYS: exe, record, pending, running set, arq in-progress key, leases hash, arq job key,
#       jobs' settled executions, audit trail, the partition's counts, the worker's losses, queued set
# ARGV: exec_id, worker_id, record, retention s, events channel, final event, metrics label, attempt or ''
REAP = Script("REAP", ACCEPTED_WORK + NOW + IMPOSE + LOSE + jobs.DUE_AGAIN + """
local h = redis.call('HMGET', KEYS[1], 'worker', 'state', 'idem', 'wake', 'attempt', 'began', 'start_by', 'queued_at',
                     'requeued_at')
if ARGV[8] ~= '' and h[5] ~= ARGV[8] then return 'moved' end
redis.call('SREM', KEYS[4], ARGV[1])
local token = redis.call('HGET', KEYS[6], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 1 then return 'settled' end
if h[1] ~= ARGV[2] or h[2] ~= 'running' then return 'moved' end
lose(KEYS[11], ARGV[1])
if not token or redis.call('GET', KEYS[5]) == token then
  redis.call('DEL', KEYS[5])
  if h[4] then due_again(h[4], ARGV[1]) end
end
if (h[3] == '1' or not h[6]) and redis.call('EXISTS', KEYS[7]) == 1 then
  local start_by = int(now + tonumber(h[7]) - tonumber(h[9] or h[8]))  -- SUBMIT and PROMOTE write both
  redis.call('HSET', KEYS[1], 'state', 'queued', 'reaped', h[5], 'start_by', start_by, 'requeued_at', int(now))
  redis.call('ZADD', KEYS[12], start_by, ARGV[1])
  return 'requeued'
end
impose(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], KEYS[8], KEYS[9], KEYS[10])
return 'uncertain'
""")

# An accepted execution that no worker started before its start-by instant (SUBMIT's, PROMOTE's,
# or REAP's when it put it back); or (ARGV[7] = '1') one still queued in the queue of a group no
# worker serves any more (store.groups), whatever its start-by: it has no worker left to wait for.
# KEYS: exe, record, pending, queued, jobs' settled executions, audit trail, the partition's counts
# ARGV: exec_id, record, retention s, events channel, final event, metrics label, '1' if abandoned
EXPIRE_UNSTARTED = Script("EXPIRE_UNSTARTED", ACCEPTED_WORK + NOW + IMPOSE + """
local h = redis.call('HMGET', KEYS[1], 'state', 'start_by')
if h[1] ~= 'queued' or redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('ZREM', KEYS[4], ARGV[1])
  return 0
end
if ARGV[7] ~= '1' and tonumber(h[2]) > now then return 0 end
redis.call('ZREM', KEYS[4], ARGV[1])
impose(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], KEYS[5], KEYS[6], KEYS[7])
return 1
""")

# settled: it had a record already; gone: Redis no longer knows it; signalled: it runs, and its
# worker was told; cancelled: it had not started, and now has its CANCELLED record.
CancelOutcome = Literal["settled", "gone", "signalled", "cancelled"]
# settled: nothing left to do; moved: another worker or attempt has it now; requeued: an
# execution that may run again (idempotent, or its tool never began) goes back to the queue;
# uncertain: settled EXECUTION_UNCERTAIN.
ReapOutcome = Literal["settled", "moved", "requeued", "uncertain"]


class Verdicts:
    """CANCEL, REAP and EXPIRE_UNSTARTED on one client, with the store-wide retention."""

    def __init__(self, redis: Redis, *, retention: int, durability: Durability | None = None) -> None:
        self._cancel = bind(redis, CANCEL, durability=durability)
        self._reap = bind(redis, REAP, durability=durability)
        self._expire = bind(redis, EXPIRE_UNSTARTED, durability=durability)
        self.retention = retention

    async def cancel(self, exec_id: str, tool: str) -> CancelOutcome:
        """Cancel for a caller that went away: at once if queued, else via its worker."""
        stored, final, label = _imposed(records.cancelled(exec_id, tool, started=False))
        partition = keys.partition_of(exec_id)
        outcome = await self._cancel(
            keys=[keys.execution(exec_id), keys.record(exec_id), *_sets(exec_id), metrics.executions(partition)],
            args=[exec_id, stored, self.retention, keys.events(exec_id), final, keys.cancel_channel(partition),
                  label],
        )
        return cast("CancelOutcome", text(outcome))

    async def reap(self, exec_id: str, tool: str, *, worker_id: str, why: str,
                   attempt: int | None = None) -> ReapOutcome:
        """Take ``exec_id`` from ``worker_id``, which stopped (``why``): re-queue it or settle it
        uncertain. With ``attempt``, only if that attempt is still the execution's current one."""
        stored, final, label = _imposed(records.uncertain(exec_id, tool, why))
        partition = keys.partition_of(exec_id)
        outcome = await self._reap(
            keys=[keys.execution(exec_id), keys.record(exec_id), keys.pending(partition),
                  keys.running(worker_id, partition), jobs.in_progress_key(exec_id),
                  keys.leases(worker_id, partition), jobs.job_key(exec_id), keys.jobs_settled(partition),
                  keys.audit(partition), metrics.executions(partition), keys.lost(worker_id, partition),
                  keys.queued(partition)],
            args=[exec_id, worker_id, stored, self.retention, keys.events(exec_id), final, label,
                  "" if attempt is None else attempt],
        )
        return cast("ReapOutcome", text(outcome))

    async def expire_unstarted(self, exec_id: str, tool: str, *, requeued: bool = False) -> bool:
        """Settle ``exec_id`` as never started if it is still queued past its start-by instant
        (``requeued``: as not started again, since REAP put it back and gave it that instant)."""
        record = records.not_restarted(exec_id, tool) if requeued else records.never_started(exec_id, tool)
        return await self._expire_queued(exec_id, record, abandoned=False)

    async def expire_abandoned(self, exec_id: str, tool: str) -> bool:
        """Settle ``exec_id`` if it is still queued, whatever its start-by: it waits in the queue of
        a group no worker serves any more (``store.groups``)."""
        return await self._expire_queued(exec_id, records.abandoned_in_queue(exec_id, tool), abandoned=True)

    async def _expire_queued(self, exec_id: str, record: Record, *, abandoned: bool) -> bool:
        stored, final, label = _imposed(record)
        partition = keys.partition_of(exec_id)
        return bool(await self._expire(
            keys=[keys.execution(exec_id), keys.record(exec_id), *_sets(exec_id), metrics.executions(partition)],
            args=[exec_id, stored, self.retention, keys.events(exec_id), final, label, "1" if abandoned else ""],
        ))


def _sets(exec_id: str) -> tuple[str, str, str, str]:
    """The pending and queued sets, the jobs' settled executions and the audit trail of
    ``exec_id``'s partition."""
    partition = keys.partition_of(exec_id)
    return keys.pending(partition), keys.queued(partition), keys.jobs_settled(partition), keys.audit(partition)


def _imposed(record: Record) -> tuple[bytes, bytes, str]:
    stored, final = final_event(record)
    return stored, final, metrics.label(record)
