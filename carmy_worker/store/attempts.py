"""A worker's attempt at an execution: CLAIM it before the tool runs, SETTLE it with the record
after. Each attempt has a number (the fencing token); only the current one may write."""

from __future__ import annotations

import functools
from typing import Literal, cast

from msgspec import Struct
from redis.asyncio import Redis

from carmy_worker.store import jobs, keys, metrics, staging
from carmy_worker.store.batch import Batch, FollowUp
from carmy_worker.store.durable import Durability
from carmy_worker.store.lua import ACCEPTED_WORK, AUDITED, EMIT, FOLLOWERS, HELD, HOLDING, LOSE, LUA_AUDIT, NOW, text
from carmy_worker.store.metrics import LUA_COUNT, LUA_OBSERVE
from carmy_worker.store.scripts import Script, bind
from carmy_worker.wire import Record, final_event

# An idempotent execution interrupted this many times is given up as uncertain.
MAX_ATTEMPTS = 3

# Lua: the bytes of wire.started_event (msgpack: the event's type, then its JSON data as bin),
# so that a script can announce a claim without the worker building the event first. Tool names
# and execution ids need no JSON escaping (their formats: sdk.toolbox, keys); a test compares
# these bytes with wire.started_event's.
STARTED = """
local function started_event(exec_id, tool)
  local data = '{"execution_id":"' .. exec_id .. '","tool":"' .. tool .. '"}'
  if #data < 256 then return '\\146\\172tool.started\\196' .. string.char(#data) .. data end
  return '\\146\\172tool.started\\197' .. string.char(math.floor(#data / 256), #data % 256) .. data
end
"""

# Lua: the next attempt at an execution, for a worker that holds its job's lease. Returns
# {verdict, attempt, ms it waited in the queue}. A non-idempotent execution is tried again only if
# no attempt ever began its tool. A claim does not mark `began`: a worker may be paused or die
# between its LEASE and the tool (a LEASE sent behind a BLPOP even runs while its worker is
# stopped), and its executions must then go to another worker, not end uncertain. What begins a
# non-idempotent tool is BEGIN, just before it; for a parallel_safe=False one, taking its lock.
# LEASE (store.leases) claims each job it leases with it, in the same round trip; CLAIM claims
# one. `exe` is the execution's hash: every key it names is of the execution's partition (LEASE
# builds it from its partition's prefix, which it is given: a queue holds its partition's only).
CLAIM_ONE = NOW + LUA_OBSERVE + EMIT + LOSE + STARTED + f"""
local function claim(exe, exec_id, worker_id, running, max_attempts, queue_wait, queued)
  -- Read before the attempt is counted, with `state` (no EXISTS of the hash or of the record):
  -- SUBMIT writes it and nothing removes it, so a hash without it is not there, or is what a
  -- late write left after the hash expired (a progress message): gone either way. Whatever
  -- writes the record (SETTLE, IMPOSE) sets it to `done` in the same script.
  -- The attempt is counted with the HSET that starts it, from the `attempt` read here (one
  -- write, not an HINCRBY then an HSET): a verdict other than run writes the count alone.
  local h = redis.call('HMGET', exe, 'cancel', 'idem', 'start_by', 'queued_at', 'began', 'tool', {FOLLOWERS}, 'state',
                       'attempt', 'worker')
  if not h[10] then return 'gone', 0, 0 end
  if h[10] == 'done' then return 'settled', 0, 0 end
  -- Listed as running on another worker (its lease was handed back while it ran): that worker
  -- loses it with this claim, and its next heartbeat must hear of it (lua.LOSE).
  if h[10] == 'running' and h[12] and h[12] ~= worker_id then lose(lost_key(exe, exec_id, h[12]), exec_id) end
  redis.call('ZREM', queued, exec_id)
  local attempt = tonumber(h[11] or 0) + 1
  local waited = now - tonumber(h[4] or now)
  local verdict
  if h[1] == '1' then verdict = 'cancelled'
  elseif attempt > 1 and h[2] ~= '1' and h[5] then verdict = 'uncertain'
  elseif attempt > max_attempts then verdict = 'uncertain'
  elseif attempt == 1 and tonumber(h[3]) < now then verdict = 'expired'
  end
  if verdict then
    redis.call('HSET', exe, 'attempt', attempt)
    return verdict, attempt, waited
  end
  local tool = h[6] or ''
  redis.call('HSET', exe, 'attempt', attempt, 'state', 'running', 'worker', worker_id, 'started_at', int(now))
  -- A rerun starts its work over: its status message (tasks/get, the console) is not the last attempt's.
  if attempt > 1 then redis.call('HDEL', exe, 'message', 'message_at') end
  redis.call('SADD', running, exec_id)
  local f = {{h[7], h[8], h[9]}}
  if emits(f, false) then emit_to(f, exec_id, '{keys.events("")}' .. exec_id, started_event(exec_id, tool), false) end
  if attempt == 1 then observe(queue_wait, tool, waited) end
  return 'run', attempt, waited
end
"""

# CLAIM_ONE for a worker that leased the job itself: only if the lease (ARGV[4], the token in
# arq's in-progress key) is still current. A lease the janitor took away (the worker was paused
# after LEASE) claims nothing: another worker has the job now.
# KEYS: running set, arq in-progress key, the partition's queue-wait histogram and queued set, exe
# ARGV: exec_id, worker_id, max attempts, lease token or ''
CLAIM = Script("CLAIM", ACCEPTED_WORK + CLAIM_ONE + """
if ARGV[4] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[4] then return {'moved', 0, 0} end
local verdict, attempt, waited = claim(KEYS[5], ARGV[1], ARGV[2], KEYS[1], tonumber(ARGV[3]), KEYS[3], KEYS[4])
return {verdict, attempt, waited}
""")

# A worker writes the record of its attempt, and frees its admission slot (and its principal's:
# the set the hash names in `quota`, store/quota.py): only if none exists and it still owns the
# current attempt, not reaped, on this worker (a paused worker waking up late finds another
# attempt, or its own put back in the queue by the janitor, and writes nothing; the worker
# check keeps two claims of the same number apart, after a Redis crash lost the first).
# With the token of the job's lease (ARGV[12]), it also ends that lease as FINISH would for a
# finished job (jobs.END_LEASE): the worker needs no round trip of its own after it.
# An execution of a job (the hash names it in `job`) is listed for the job loop to conclude
# (store.jobstore), in the same script, so that no job waits on a record nobody reads; and the
# execution's audit entry is appended (store.audit), so that none finishes without one.
# The queued set is not touched: the attempt it presents was claimed, and every claim (CLAIM_ONE,
# HEARTBEAT's claim again) took the execution out of it in the same script; what puts one back
# (REAP's requeue, with a start-by of its own) also ends the attempt, which then writes nothing.
# One HMGET reads what it decides on and what its audit entry tells (lua.AUDITED, first: `h` is
# what `audit_from` takes; the entry's `job` and `worker`, h[2] and h[6], are SETTLE's too).
# A large record is not an argument (store.staging): the worker has written it to the staged
# record key just ahead, and the record is that key renamed, or the staged key is dropped with any
# answer but 1. Staged but gone (it outlived its TTL, a failover or a slot's move lost it, or a full
# Redis refused the SET, which SETTLE's allow-oom would not have): -1, nothing written, and the
# worker sends the record inline.
# KEYS: exe, record, pending, running set, arq in-progress key, arq job, arq retry key, arq queue,
#       leases hash, jobs' settled executions, audit trail, the partition's counts and run-time
#       histogram, staged record: every one of the execution's partition
# ARGV: exec_id, attempt, record ('' if staged), retention s, events channel, final event, tool.completed event or '',
#       metrics label, tool, run ms or '', worker_id if this attempt ran (CLAIM said run) or '',
#       lease token or ''
SETTLE = Script("SETTLE", ACCEPTED_WORK + NOW + LUA_COUNT + LUA_OBSERVE + EMIT + LUA_AUDIT + jobs.END_LEASE
                + staging.LUA_STAGED + f"""
local staged = ARGV[3] == ''
local function settle()
local h = redis.call('HMGET', KEYS[1], {AUDITED}, 'attempt', 'reaped', 'quota', {FOLLOWERS}, 'state')
-- A record exists once the state is done: whatever writes one sets it in the same script.
if h[15] == 'done' or h[9] ~= ARGV[2] or h[10] == ARGV[2] then return 0 end
if ARGV[11] ~= '' and h[6] ~= ARGV[11] then return 0 end
if staged and not present(KEYS[14]) then return -1 end
local now_s = int(now)
place(KEYS[14], KEYS[2], ARGV[3], ARGV[4])
redis.call('HSET', KEYS[1], 'state', 'done', 'ended_at', now_s)
redis.call('ZREM', KEYS[3], ARGV[1])
if h[11] then redis.call('ZREM', h[11], ARGV[1]) end
redis.call('SREM', KEYS[4], ARGV[1])
if h[2] then redis.call('ZADD', KEYS[10], now_s, ARGV[1]) end
local f = {{h[12], h[13], h[14]}}
if ARGV[7] ~= '' then emit_to(f, ARGV[1], ARGV[5], ARGV[7], false) end
emit_to(f, ARGV[1], ARGV[5], ARGV[6], true)
count(KEYS[12], ARGV[8])
if ARGV[10] ~= '' then observe(KEYS[13], ARGV[9], ARGV[10]) end
audit_from(KEYS[11], h, ARGV[1], now_s, ARGV[8], ARGV[10], '')
if ARGV[12] ~= '' then end_lease(KEYS[9], KEYS[5], KEYS[6], KEYS[7], KEYS[8], ARGV[1], ARGV[12], true) end
return 1
end
local answer = settle()
if staged and answer ~= 1 then drop(KEYS[14]) end
return answer
""")

# Whether an attempt still holds its execution (lua.HELD: so it has no record yet, as every
# script that writes one sets `done` with it). With ARGV[3] = '1' (BEGIN), an attempt that holds
# it also marks that it began the tool, just before it does.
# KEYS: exe; ARGV: attempt, worker_id, '1' to mark `began`
HOLDS = Script("HOLDS", ACCEPTED_WORK + HELD + f"""
if held(redis.call('HMGET', KEYS[1], {HOLDING}), ARGV[1], ARGV[2]) then
  if ARGV[3] == '1' then redis.call('HSET', KEYS[1], 'began', ARGV[1]) end
  return 1
end
return 0
""")

# run: this attempt may run the tool. Otherwise the worker records the matching verdict (unless
# settled, gone, or moved to another lease): cancelled before it started, uncertain (a non-idempotent execution already
# attempted, or an idempotent one interrupted too often), expired (waited past its start-by).
ClaimVerdict = Literal["run", "settled", "gone", "moved", "cancelled", "uncertain", "expired"]


class Claim(Struct):
    verdict: ClaimVerdict
    attempt: int  # the fencing token SETTLE must present
    queue_wait_ms: int


@functools.lru_cache(maxsize=256)  # one per partition: SETTLE names them on every execution
def _counts(partition: int) -> tuple[str, str]:
    """The counts SETTLE adds to, in its execution's partition: its records, its run times."""
    return metrics.executions(partition), metrics.histogram("run", partition)


@functools.lru_cache(maxsize=256)
def _sets(partition: int) -> tuple[str, str, str]:
    """The partition's admitted (pending) executions, its jobs' settled executions and its audit trail."""
    return keys.pending(partition), keys.jobs_settled(partition), keys.audit(partition)


class Attempts:
    """CLAIM and SETTLE for the executions of one worker."""

    def __init__(self, redis: Redis, *, worker_id: str, retention: int, durability: Durability | None = None,
                 group: str | None = None) -> None:
        # On a connection kept for them; written at once while Redis has little else of this
        # worker's to run, since a slot of the worker waits on each SETTLE (store.batch, eager);
        # and answered after the final events they publish, which callers wait for (reply_last).
        batch = Batch(redis, eager=True, reply_last=True)
        self._claim = bind(redis, CLAIM, durability=durability, batch=batch)
        self._settle = bind(redis, SETTLE, durability=durability, batch=batch)
        self._holds = bind(redis, HOLDS)
        # A `began` a failover loses would let a non-idempotent tool run again (store.durable).
        self._begin = bind(redis, HOLDS, durability=durability)
        self.worker_id = worker_id
        self.retention = retention
        # The group of the worker's arq queues (one per partition): SETTLE ends a job's lease in
        # its execution's. None: no lease is ever given (SETTLE still names a queue of the
        # execution's slot, never written: a cluster refuses an empty key name, in slot 0).
        self.group = group
        # Per partition: this worker's running set and leases hash there, and its queue there.
        self._keys = [(keys.running(worker_id, p), keys.leases(worker_id, p), jobs.queue_name(group or "", p))
                      for p in keys.partitions()]

    async def claim(self, exec_id: str, *, max_attempts: int, lease: str = "") -> Claim:
        """Take the next attempt, if ``lease`` (the token of the job's lease) is still current;
        on ``run`` the execution is this worker's and ``tool.started`` is out."""
        partition = keys.partition_of(exec_id)
        verdict, attempt, waited = await self._claim(
            keys=[self._keys[partition][0], jobs.in_progress_key(exec_id),
                  metrics.histogram("queue_wait", partition), keys.queued(partition), keys.execution(exec_id)],
            args=[exec_id, self.worker_id, max_attempts, lease],
        )
        return Claim(cast("ClaimVerdict", text(verdict)), int(attempt), int(waited))

    async def settle(self, record: Record, *, exec_id: str, attempt: int, completed_event: bytes | None = None,
                     run_ms: int | None = None, ran: bool = True, lease: str = "",
                     then: FollowUp | None = None) -> bool:
        """Write ``record`` and announce it, if ``attempt`` is still the current one and none was written.

        ``completed_event`` (``tool.completed``) goes out just before the ``final`` event;
        ``run_ms``, when the tool ran, feeds the run-time histogram. ``ran``: the attempt was
        claimed to run (not to record a verdict), so it must also still be this worker's.
        ``lease``: the token of the job's lease, ended with it if written (the job is finished);
        a lease no longer this one's is left alone, as FINISH would.
        ``then``: a call sent right behind this one, in the same write (the worker's LEASE of
        the job its freed slot runs next), if SETTLE goes out batched; when it waits for
        replicas (``store.durable``) ``then`` is not sent, and its ``reply`` stays None.
        """
        stored, final = final_event(record)
        partition = keys.partition_of(exec_id)
        pending, settled, audit = _sets(partition)
        running, leases, queue = self._keys[partition]
        stage = keys.staged_record(exec_id)
        keys_ = [keys.execution(exec_id), keys.record(exec_id), pending, running,
                 jobs.in_progress_key(exec_id), jobs.job_key(exec_id), jobs.retry_key(exec_id), queue,
                 leases, settled, audit, *_counts(partition), stage]
        args = [exec_id, attempt, stored, self.retention, keys.events(exec_id), final, completed_event or b"",
                metrics.label(record), record.tool, "" if run_ms is None else run_ms, self.worker_id if ran else "",
                lease]
        before = None
        if staging.staged(stored):
            before = staging.stage(stage, stored)
            args[2] = ""
        if then is not None and self._settle.batched:
            written = await self._settle.send(keys_, args, then, before=before)
        else:
            written = await self._settle.queue(keys_, args, before=before)
        if written == -1:  # the staged record was gone: the record inline, as it would have gone
            args[2] = stored
            written = await self._settle(keys=keys_, args=args)
        return bool(written)

    async def holds(self, exec_id: str, attempt: int) -> bool:
        """Whether ``attempt`` is still the current, running attempt at ``exec_id``, with no record."""
        return bool(await self._holds(keys=[keys.execution(exec_id)], args=[attempt, self.worker_id, ""]))

    async def begin(self, exec_id: str, attempt: int) -> bool:
        """Just before a non-idempotent tool starts: whether ``attempt`` still holds ``exec_id``,
        marked as having begun its tool if so (a later attempt is then uncertain, not a rerun)."""
        return bool(await self._begin(keys=[keys.execution(exec_id)], args=[attempt, self.worker_id, "1"]))
