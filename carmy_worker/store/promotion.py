"""The workers' side of jobs (store.jobstore): what is due, promoting a due job to an execution,
concluding an attempt once its execution has a record, and firing schedules. Each is one script,
safe to run from any number of workers at once: every write checks the state it expects first.

Each runs inside one partition (docs/architecture.md, section 3): LOOK on a partition's indexes
and the worker's group's queue there (``jobs.queue_name``), PROMOTE of that partition's due jobs into
executions drawn into it, CONCLUDE in the job's, FIRE in the schedule's. A job loop runs them
for every partition in turn.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from carmy_worker.store import jobs, keys, metrics
from carmy_worker.store.batch import Batch
from carmy_worker.store.durable import Durability
from carmy_worker.store.jobstore import CREATE_JOB, FINISH_JOB
from carmy_worker.store.lua import ACCEPTED_WORK, NEW_WORK, NOW, text
from carmy_worker.store.metrics import LUA_OBSERVE
from carmy_worker.store.scripts import Script, bind
from carmy_worker.wire import Record, ScheduleSpec, msgpack_encoder, record_decoder

# What a worker's job loop has to do: executions of jobs that have their record (at most
# ARGV[2]), and jobs due now in the due sets of its tools, as many as its queue has room for
# (ARGV[1] jobs queued at most), oldest first; and when the next one is due (ms, '' if none).
# What it returns is leased to this loop: pushed out of the other loops' sight, the executions
# for ARGV[3] ms and the jobs for ARGV[4] ms (their hashes keep when they are due), so that
# each is concluded, or promoted, by one loop rather than by every one at once. CONCLUDE and
# PROMOTE remove what they took; what a loop that died leased comes back when its lease ends.
# The due jobs it leased are also written down for this loop (KEYS[3]), with this LOOK's number
# (ARGV[6], the loop's count of its LOOKs): a loop whose last LOOK's reply never reached it (a
# connection cut as Redis answered) names the last one it read (ARGV[5]), and gets that LOOK's
# jobs again, those still held by the lease it gave them, rather than leaving them to wait that
# lease out.
# KEYS (one partition's): settled executions, the worker's arq queue, this loop's last LOOK, then
#       the due set of each of its tools
# ARGV: queue room, settled at most, settled lease ms, due lease ms, the number of this loop's last
#       LOOK here whose reply it read ('' if none), this LOOK's number
LOOK = Script("JOBS_LOOK", ACCEPTED_WORK + NOW + """
local settled = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, e in ipairs(settled) do redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), e) end
local room = tonumber(ARGV[1]) - redis.call('ZCARD', KEYS[2])
local due, leased, next_due = {}, {}, nil
local looked = redis.call('GET', KEYS[3])
if looked and string.match(looked, '^%d+') ~= ARGV[5] then
  for tool, id, ends in string.gmatch(looked, ' (%d+) (%S+) (%d+)') do
    local score = redis.call('ZSCORE', KEYS[tonumber(tool) + 3], id)
    if tonumber(ends) > now and score and tonumber(score) == tonumber(ends) then  -- still under that LOOK's lease
      table.insert(due, tool) table.insert(due, id)
      table.insert(leased, tool .. ' ' .. id .. ' ' .. ends)
      room = room - 1
    end
  end
end
local ends = int(now + tonumber(ARGV[4]))
for i = 4, #KEYS do
  if room > 0 then
    local ids = redis.call('ZRANGEBYSCORE', KEYS[i], '-inf', now, 'LIMIT', 0, math.min(room, 500))
    for _, id in ipairs(ids) do
      redis.call('ZADD', KEYS[i], 'XX', ends, id)
      table.insert(due, tostring(i - 3)) table.insert(due, id)
      table.insert(leased, tostring(i - 3) .. ' ' .. id .. ' ' .. ends)
    end
    room = room - #ids
  end
  local first = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
  if first[2] and (not next_due or tonumber(first[2]) < next_due) then next_due = tonumber(first[2]) end
end
if #leased > 0 then
  redis.call('SET', KEYS[3], ARGV[6] .. ' ' .. table.concat(leased, ' '), 'PX', ARGV[4])
elseif looked then
  redis.call('DEL', KEYS[3])
end
return {settled, due, next_due and tostring(next_due) or '', int(now)}
""")

# Due jobs of one tool become executions, each only if it is still queued, due, and at the
# attempt its payload was built for: the job's next attempt (`exec`, `attempts`), the execution
# (as SUBMIT writes one, owned by the job's owner, its events on its own channel), its arq job,
# its place in the queue, and one idle worker woken. A job no longer queued leaves the due set.
# What its audit entry tells (store.audit) goes in the execution's hash too: the attempt's request
# id, the job's principal, the tool's effect, and `job` as the door it came in by.
# Every key in the jobs' partition: the queue is its copy of the worker's, the executions' ids are
# drawn into it (`keys.new_execution_id(partition)`), and so is the wake list, named in ARGV.
# KEYS: due set, arq queue, pending, queued, jobs' running executions, then per job: job, exe, arq job
# ARGV: wake list, tool, start window ms, admission ms beyond it, execution retention s, the tool's effect,
#       then per job: job_id, attempts it was at, exec_id, arq job bytes, request id, principal
PROMOTE = Script("JOBS_PROMOTE", ACCEPTED_WORK + NOW + jobs.WAKE_ONE + """
local promoted = {}
local start_by = now + tonumber(ARGV[3])
local retention = tonumber(ARGV[5])
for i = 0, (#ARGV - 6) / 6 - 1 do
  local job_id, at, exec_id, arq = ARGV[7 + 6 * i], ARGV[8 + 6 * i], ARGV[9 + 6 * i], ARGV[10 + 6 * i]
  local job, exe, arq_key = KEYS[6 + 3 * i], KEYS[7 + 3 * i], KEYS[8 + 3 * i]
  local h = redis.call('HMGET', job, 'status', 'attempts', 'due', 'owner', 'idem', 'executions')
  if h[1] ~= 'queued' then
    redis.call('ZREM', KEYS[1], job_id)
  elseif h[2] == at and tonumber(h[3]) <= now then
    redis.call('ZREM', KEYS[1], job_id)
    local executions = exec_id
    if h[6] and h[6] ~= '' then executions = h[6] .. ' ' .. exec_id end
    redis.call('HSET', job, 'status', 'running', 'attempts', tonumber(at) + 1, 'exec', exec_id,
               'executions', executions, 'updated_at', now)
    redis.call('HSET', exe, 'tool', ARGV[2], 'owner', h[4], 'idem', h[5] or '', 'state', 'queued', 'attempt', 0,
               'start_by', start_by, 'wake', ARGV[1], 'queued_at', now, 'job', job_id,
               'rid', ARGV[11 + 6 * i], 'principal', ARGV[12 + 6 * i], 'via', 'job', 'effect', ARGV[6])
    redis.call('EXPIRE', exe, retention)
    redis.call('ZADD', KEYS[3], start_by + tonumber(ARGV[4]), exec_id)
    redis.call('ZADD', KEYS[4], start_by, exec_id)
    redis.call('SET', arq_key, arq, 'EX', retention)
    redis.call('ZADD', KEYS[2], now, exec_id)
    redis.call('ZADD', KEYS[5], now, exec_id .. ' ' .. job_id)
    wake_one(ARGV[1])
    table.insert(promoted, job_id)
  end
end
return promoted
""")

# An attempt's execution has its record: the job goes on as its job loop decided (ARGV[2]:
# queued again after ARGV[3] ms, or finished), only if this execution is still the job's current
# attempt and the job still runs (another worker's loop may have concluded it first). A job its
# caller cancelled while it ran ends cancelled rather than queued again.
# KEYS (the job's partition): job, settled executions, running executions, due set, owner's open jobs,
#       idempotency (or the job), callbacks due, dead letters, expiring, job counts, lateness histogram
# ARGV: exec_id, status, delay ms, last error JSON or '', result JSON or '', lateness ms or '', tool, job_id
CONCLUDE = Script("JOBS_CONCLUDE", ACCEPTED_WORK + NOW + LUA_OBSERVE + FINISH_JOB + """
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1] .. ' ' .. ARGV[8])
local h = redis.call('HMGET', KEYS[1], 'status', 'exec', 'cancel')
if h[1] ~= 'running' or h[2] ~= ARGV[1] then return '' end
local status = ARGV[2]
if status == 'queued' and h[3] == '1' then status = 'cancelled' end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'last_error', ARGV[4]) end
if ARGV[6] ~= '' then observe(KEYS[11], ARGV[7], tonumber(ARGV[6])) end
if status == 'queued' then
  local due = now + tonumber(ARGV[3])
  redis.call('HSET', KEYS[1], 'status', 'queued', 'due', due, 'updated_at', now)
  redis.call('ZADD', KEYS[4], due, ARGV[8])
  count_job(KEYS[10], ARGV[7], 'retried')
else
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'result', ARGV[5]) end
  local k = {job = KEYS[1], due = KEYS[4], open = KEYS[5], callbacks = KEYS[7], dead = KEYS[8], expiring = KEYS[9],
             counts = KEYS[10]}
  finish_job(k, ARGV[8], ARGV[7], status, KEYS[6] ~= KEYS[1] and KEYS[6] or '', now)
end
return status
""")

# Lua: how long a schedule's state is kept: ``kept_ms`` (the worker passes the schedule's grace and
# its CARMY_JOBS_RETENTION) past the occurrence it waits for, or past now if that one is gone.
# Every write of ``next`` sets it, so a schedule whose workers fire it never loses its state (a
# yearly one's is kept past next year's occurrence), while the state of one nobody declares any
# more (a deploy removed or renamed it) goes that long after the occurrence it last waited for.
SCHEDULE_KEEP = """
local function keep_schedule(key, next_ms, kept_ms)
  redis.call('PEXPIREAT', key, int(math.max(now, tonumber(next_ms)) + tonumber(kept_ms)))
end
"""

# A schedule's state is made (or remade, when its definition changed): the occurrence it waits
# for. Returns the one it waits for now. With ARGV[4] and ARGV[5], a take-over: only if the
# schedule still has that definition and still waits for that occurrence (nobody fired it since).
# Whenever the state is left under the caller's definition, it is kept ARGV[3] ms past the
# occurrence it waits for (past now, if that occurrence is gone: its workers were down), as FIRE
# keeps it: the state of a schedule nobody declares any more goes by itself (``SCHEDULE_KEEP``).
# KEYS: schedule; ARGV: definition's digest, first occurrence ms, kept ms,
#       [the definition and occurrence replaced]
ENSURE_SCHEDULE = Script("SCHEDULE_ENSURE", ACCEPTED_WORK + NOW + SCHEDULE_KEEP + """
local cur = redis.call('HMGET', KEYS[1], 'spec', 'next')
if cur[1] == ARGV[1] and cur[2] then
  keep_schedule(KEYS[1], cur[2], ARGV[3])
  return cur[2]
end
if ARGV[4] and cur[2] and (cur[1] ~= ARGV[4] or cur[2] ~= ARGV[5]) then return cur[2] end
redis.call('HSET', KEYS[1], 'spec', ARGV[1], 'next', ARGV[2])
keep_schedule(KEYS[1], ARGV[2], ARGV[3])
return ARGV[2]
""")

# A schedule fires: only if it still waits for the occurrence ARGV[1] under the same definition
# (whoever gets here first fires; the rest see it moved, and by which definition), it now waits for ARGV[2], counts the
# occurrences it skipped, and queues one job for each occurrence fired, under a request id of
# its own (a job already there for it is left alone).
# New work: a full Redis refuses it whole (lua.NEW_WORK), and the occurrence is fired once there
# is room, or skipped once past its grace.
# Every key in the schedule's partition (keys.schedule_partition), its jobs' ids drawn there.
# The state is kept ARGV[7] ms past the occurrence it now waits for (``SCHEDULE_KEEP``).
# KEYS: schedule, due set, owner's jobs, owner's open jobs, every job, job counts,
#       then per occurrence: job, idempotency
# ARGV: occurrence waited for, next, skipped, definition's digest, tool, schedule name, kept ms,
#       count of the shared fields, the shared fields, then per occurrence: job_id, ms, request id, payload
FIRE = Script("SCHEDULE_FIRE", NEW_WORK + NOW + CREATE_JOB + SCHEDULE_KEEP + """
local cur = redis.call('HMGET', KEYS[1], 'next', 'spec')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[4] then return {'moved', cur[1] or '', cur[2] or ''} end
redis.call('HSET', KEYS[1], 'next', ARGV[2])
keep_schedule(KEYS[1], ARGV[2], ARGV[7])
local skipped = tonumber(ARGV[3])
if skipped > 0 then
  redis.call('HINCRBY', KEYS[1], 'skipped', skipped)
  count_job(KEYS[6], ARGV[5], 'skipped', skipped)
end
local shared = tonumber(ARGV[8])
local fired = {'fired'}
local first = 9 + shared
for i = 0, (#ARGV - first + 1) / 4 - 1 do
  local at_i = first + 4 * i
  local job_id, at, rid, payload = ARGV[at_i], ARGV[at_i + 1], ARGV[at_i + 2], ARGV[at_i + 3]
  local job, idem = KEYS[7 + 2 * i], KEYS[8 + 2 * i]
  if redis.call('SET', idem, job_id .. ' schedule', 'NX') then
    local fields = {}
    for j = 9, 8 + shared do table.insert(fields, ARGV[j]) end
    for _, v in ipairs({'request_id', rid, 'payload', payload, 'schedule', ARGV[6], 'idem_key', idem}) do
      table.insert(fields, v)
    end
    local k = {job = job, due = KEYS[2], by = KEYS[3], open = KEYS[4], all = KEYS[5], counts = KEYS[6]}
    create_job(k, job_id, ARGV[5], fields, math.max(tonumber(at), now), tonumber(at), now)
    redis.call('HSET', KEYS[1], 'last_job', job_id, 'last_at', at)
    redis.call('HINCRBY', KEYS[1], 'fired', 1)
    table.insert(fired, job_id)
  end
end
return fired
""")


# How long what LOOK hands a loop stays out of the other loops' sight: a loop that died with it
# leased (killed between LOOK and CONCLUDE or PROMOTE) delays it this long, no more.
SETTLED_LEASE_MS = 30_000
DUE_LEASE_MS = 10_000


@dataclass(frozen=True)
class Look:
    """What LOOK found: executions to conclude, due jobs (tool, job_id), when the next job is
    due (unix ms, None if none), and Redis's clock (ms)."""

    settled: list[str]
    due: list[tuple[str, str]]
    next_due_ms: int | None
    now_ms: int


@dataclass(frozen=True)
class Due:
    """A due job as its promotion needs it: its status, the attempts it has made, its payload
    (an ``ExecutionJob`` without an execution id, msgpack) and its request id."""

    job_id: str
    status: str | None
    attempts: int
    payload: bytes | None
    request_id: str | None


@dataclass(frozen=True)
class Ended:
    """An execution of a job that has its record: its job (None if its hash expired), the record
    (None if Redis lost it), whether its tool began (``began``: a non-idempotent tool marks it just
    before it starts; any other counts as begun once claimed to run) and when it was claimed."""

    execution_id: str
    job_id: str | None
    record: Record | None
    began: bool
    started_ms: int | None


@dataclass(frozen=True)
class Fired:
    """What FIRE did: ``fired`` and the ``job_ids`` it queued; or not, the schedule having moved:
    the occurrence it waits for (``next_ms``, None if its state is gone) under the definition
    ``digest`` (another than the caller's, when workers define it differently)."""

    fired: bool
    job_ids: list[str]
    next_ms: int | None = None
    digest: str = ""


def schedule_digest(spec: ScheduleSpec) -> str:
    """A schedule's definition, as its state names it: a new one (another cron, tool, arguments,
    timezone or grace) starts over from its next occurrence rather than from the old one's."""
    return hashlib.sha256(msgpack_encoder.encode(spec)).hexdigest()[:16]


@dataclass(frozen=True)
class Promotion:
    """One due job made an execution: its id, the attempt it was at, and the arq job; the
    attempt's request id and the job's principal, for its audit entry."""

    job_id: str
    attempts: int
    execution_id: str
    arq_job: bytes
    request_id: str = ""
    principal: str = ""


class Promotions:
    """LOOK, PROMOTE, CONCLUDE, and a schedule's ENSURE and FIRE, on one client."""

    def __init__(self, redis: Redis, *, durability: Durability | None = None) -> None:
        self.redis = redis
        self._look = bind(redis, LOOK)
        self._promote = bind(redis, PROMOTE, durability=durability)
        # Attempts that end together are concluded together: one write for a turn's CONCLUDEs.
        self._conclude = bind(redis, CONCLUDE, durability=durability, batch=Batch(redis))
        self._ensure = bind(redis, ENSURE_SCHEDULE)
        self._fire = bind(redis, FIRE, durability=durability)

    async def look(self, tools: list[str], group: str, partition: int, *, room: int, loop_id: str,
                   number: int, read: int | None = None, settled_at_most: int = 200,
                   settled_lease_ms: int = SETTLED_LEASE_MS, due_lease_ms: int = DUE_LEASE_MS) -> Look:
        """LOOK in ``partition``: what the loop ``loop_id`` has to do there now, leased to it (see
        the script); ``group``: the worker's, ``room`` how many executions its queue in the
        partition may hold (what it holds already counts against it). ``number``: this LOOK's, in
        the loop's count of them; ``read``: that of its last LOOK there whose reply it read. If a
        later one's reply was lost, the due jobs that one leased come back in this one."""
        settled, due, next_due, now = await self._look(
            keys=[keys.jobs_settled(partition), jobs.queue_name(group, partition), keys.jobs_looked(loop_id, partition),
                  *(keys.job_due(tool, partition) for tool in tools)],
            args=[room, settled_at_most, settled_lease_ms, due_lease_ms, "" if read is None else read, number])
        pairs = [(tools[int(due[i]) - 1], due[i + 1].decode()) for i in range(0, len(due), 2)]
        return Look([e.decode() for e in settled], pairs, int(next_due) if next_due else None, int(now))

    async def queued(self, group: str) -> list[int]:
        """How many executions ``group``'s queue holds in each partition (queued or running: an
        entry leaves its queue as its execution ends), in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for partition in keys.partitions():
                pipe.zcard(jobs.queue_name(group, partition))
            return [int(n) for n in await pipe.execute()]

    async def queued_in(self, group: str, partition: int) -> int:
        """How many executions ``group``'s queue holds in ``partition`` (``queued``, for one)."""
        return int(await self.redis.zcard(jobs.queue_name(group, partition)))

    async def due(self, job_ids: list[str]) -> list[Due]:
        """What promoting ``job_ids`` needs to know of each, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hmget(keys.job(job_id), ["status", "attempts", "payload", "request_id"])
            rows = await pipe.execute()
        return [Due(job_id, status.decode() if status else None, int(attempts or 0), payload,
                    request_id.decode() if request_id else None)
                for job_id, (status, attempts, payload, request_id) in zip(job_ids, rows, strict=True)]

    async def ended(self, execution_ids: list[str]) -> list[Ended]:
        """The executions listed as settled, with their records, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for exec_id in execution_ids:
                pipe.hmget(keys.execution(exec_id), ["job", "started_at", "began", "idem"])
                pipe.get(keys.record(exec_id))
            replies = await pipe.execute()
        ended = []
        for i, exec_id in enumerate(execution_ids):
            (job_id, started_at, began, idem), raw = replies[2 * i], replies[2 * i + 1]
            ended.append(Ended(
                exec_id, job_id.decode() if job_id else None, None if raw is None else record_decoder.decode(raw),
                began is not None or (idem == b"1" and started_at is not None),
                int(started_at) if started_at else None))
        return ended

    async def promote(self, tool: str, promotions: list[Promotion], partition: int, *, group: str,
                      start_window_ms: int, admission_ms: int, retention: int, effect: str = "") -> list[str]:
        """PROMOTE in ``partition`` (its jobs' and their executions', ``new_execution_id``): the ids
        of the jobs that became executions, queued on ``group``'s queue in the partition (an
        execution is queued in its own partition: ``effect``: the tool's)."""
        queue = jobs.queue_name(group, partition)
        redis_keys: list[Any] = [keys.job_due(tool, partition), queue, keys.pending(partition), keys.queued(partition),
                                 keys.jobs_running(partition)]
        args: list[Any] = [jobs.wake_list(queue), tool, start_window_ms, admission_ms, retention, effect]
        for p in promotions:
            redis_keys += [keys.job(p.job_id), keys.execution(p.execution_id), jobs.job_key(p.execution_id)]
            args += [p.job_id, p.attempts, p.execution_id, p.arq_job, p.request_id, p.principal]
        return [raw.decode() for raw in await self._promote(keys=redis_keys, args=args)]

    async def conclude(self, *, job_id: str, tool: str, owner: str, idem_key: str, execution_id: str, status: str,
                       delay_ms: int = 0, last_error: bytes = b"", result: bytes = b"",
                       lateness_ms: int | None = None) -> str:
        """CONCLUDE: the status the job went to ('' if another loop concluded it first)."""
        p = keys.partition_of(job_id)
        answer = await self._conclude(
            keys=[keys.job(job_id), keys.jobs_settled(p), keys.jobs_running(p), keys.job_due(tool, p),
                  keys.jobs_open(owner, p), idem_key or keys.job(job_id), keys.callbacks_due(p), keys.jobs_dead(p),
                  keys.jobs_expiring(p), metrics.jobs(p), metrics.job_lateness(p)],
            args=[execution_id, status, delay_ms, last_error, result, "" if lateness_ms is None else lateness_ms,
                  tool, job_id])
        return text(answer)

    async def forget_settled(self, execution_id: str) -> None:
        """An execution listed as settled whose job is gone: nothing to conclude."""
        await self.redis.zrem(keys.jobs_settled(keys.partition_of(execution_id)), execution_id)

    async def lost(self, partition: int, *, older_than_ms: int, at_most: int = 100) -> list[tuple[str, str]]:
        """``partition``'s executions of jobs promoted more than ``older_than_ms`` ago whose hash and record
        are both gone (Redis lost them, restarted without its data): (execution, job) each,
        whose attempt nothing will ever settle. The caller concludes them."""
        now_s, now_us = await self.redis.time()
        now = now_s * 1000 + now_us // 1000
        candidates = [e.decode().split(" ", 1) for e in await self.redis.zrangebyscore(
            keys.jobs_running(partition), "-inf", now - older_than_ms, start=0, num=at_most)]
        if not candidates:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for exec_id, _ in candidates:
                pipe.exists(keys.execution(exec_id), keys.record(exec_id))
            found = await pipe.execute()
        return [(e, j) for (e, j), n in zip(candidates, found, strict=True) if n == 0]

    async def ensure_schedule(self, name: str, digest: str, first_ms: int, *, kept_ms: int,
                              replacing: tuple[str, int] | None = None) -> int:
        """The occurrence schedule ``name`` waits for, under definition ``digest`` from now on
        (waiting for ``first_ms`` if it had another, or none), its state kept ``kept_ms`` past
        that occurrence (or now, if later). ``replacing``: (definition, occurrence) it takes over
        from, only if the schedule still waits for that one by that."""
        args: list[Any] = [digest, first_ms, kept_ms]
        if replacing is not None:
            args += replacing
        return int(await self._ensure(keys=[keys.schedule(name)], args=args))

    async def fire(self, *, name: str, digest: str, tool: str, owner: str, waited_for: int, next_ms: int,
                   kept_ms: int, skipped: int, shared: list[Any], occurrences: list[tuple[str, int, str, bytes]],
                   idempotency: list[str]) -> Fired:
        """FIRE: whether this call fired and the jobs it queued (the state then waits for
        ``next_ms``, kept ``kept_ms`` past it), or, if the schedule had moved (another fired
        first, or it has another definition), what it waits for and by which definition.
        ``occurrences``: (job_id, ms, request id, payload) each, with its ``idempotency`` key,
        the job ids drawn into the schedule's partition (``keys.schedule_partition``)."""
        p = keys.schedule_partition(name)
        redis_keys: list[Any] = [keys.schedule(name), keys.job_due(tool, p), keys.jobs_of(owner, p),
                                 keys.jobs_open(owner, p), keys.jobs_all(p), metrics.jobs(p)]
        args: list[Any] = [waited_for, next_ms, skipped, digest, tool, name, kept_ms, len(shared), *shared]
        for (job_id, at, rid, payload), idem in zip(occurrences, idempotency, strict=True):
            redis_keys += [keys.job(job_id), idem]
            args += [job_id, at, rid, payload]
        answer = await self._fire(keys=redis_keys, args=args)
        if text(answer[0]) == "moved":
            return Fired(False, [], int(answer[1]) if answer[1] else None, text(answer[2]) if len(answer) > 2 else "")
        return Fired(True, [text(v) for v in answer[1:]])

    async def schedule_state(self, names: list[str]) -> list[dict[str, str]]:
        """Each schedule's state as its hash holds it (spec, next, last_job, last_at, skipped, fired)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hgetall(keys.schedule(name))
            rows = await pipe.execute()
        return [{k.decode(): v.decode() for k, v in row.items()} for row in rows]
