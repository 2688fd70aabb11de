"""Jobs in Redis: the calls of ``/agent/jobs`` that run later, again after a failure that may
pass, or on a schedule. (Not arq's jobs: ``store.jobs`` is the queue's layout.)

A job is a hash (``keys.job``) that outlives its executions. While ``queued`` it waits in its
tool's due set (``keys.job_due``, scored by when it is due); once due, a worker serving the tool
promotes it to an execution like any other (``store.promotion``: one script writes the
execution, its arq job and the job's new attempt together, so an attempt is started at most
once whatever the number of workers). The execution's record, when SETTLE or an imposed
verdict writes it, lists the execution in ``keys.jobs_settled`` of its partition (the job's:
PROMOTE draws the execution's id there); a worker's job loop then concludes the attempt: the
job is finished (``succeeded``, ``failed``, ``dead_lettered``, ``cancelled``) or due again
after a backoff.

Every key of a job is in its id's partition, and so is every index that lists it, so that each
script here runs in one partition (docs/architecture.md, section 3, "Jobs across partitions").
Where a job is drawn (``JobStore.new_job_id``): a principal with a quota has all its jobs in its
home partition, where its rate's bucket is, and its limit on unfinished jobs is exact; any other
principal's jobs spread over the partitions (by their request id's digest, or at random), each
partition holding at most its ``keys.share`` of the limit. Lists over partitions are
``store.joblists``'.

This module is the API's side, and what both sides share: CREATE (also run by a schedule's
FIRE), reads, lists, CANCEL, and an operator's RETRY and PURGE.
"""

from __future__ import annotations

import builtins
import time
from typing import Any, Literal, cast

import msgspec
from msgspec import Struct
from redis.asyncio import Redis
from redis.exceptions import OutOfMemoryError

from carmy_worker.store import keys, metrics
from carmy_worker.store.durable import Durability
from carmy_worker.store.joblists import Cursor, Page, listed
from carmy_worker.store.lua import ACCEPTED_WORK, NEW_WORK, NOW, text
from carmy_worker.store.metrics import LUA_COUNT_JOB
from carmy_worker.store.quota import NO_QUOTA, QUOTA, Quota
from carmy_worker.store.scripts import Script, bind
from carmy_worker.wire import JobStatus, JobView, NotifyAttempt, NotifyState, NotifyView, RetryPolicy

FINISHED: frozenset[str] = frozenset({"succeeded", "failed", "dead_lettered", "cancelled"})
attempt_decoder = msgspec.json.Decoder(NotifyAttempt)

# Lua: a new job, queued: its hash (`fields` are its parts from the caller, then what this adds),
# due at `due` in its tool's due set, and listed (everyone's, its owner's, its owner's open ones:
# job -> created, µs). `k`: the job's partition's keys (job, due, by, open, all, counts).
# Unfinished jobs never expire; a finished one expires with its retention (store.promotion).
CREATE_JOB = LUA_COUNT_JOB + """
local function create_job(k, job_id, tool, fields, due, run_at, now)
  table.insert(fields, 'status') table.insert(fields, 'queued')
  table.insert(fields, 'due') table.insert(fields, due)
  table.insert(fields, 'run_at') table.insert(fields, run_at)
  table.insert(fields, 'created_at') table.insert(fields, now)
  table.insert(fields, 'updated_at') table.insert(fields, now)
  table.insert(fields, 'attempts') table.insert(fields, 0)
  table.insert(fields, 'base_attempts') table.insert(fields, 0)
  redis.call('HSET', k.job, unpack(fields))
  redis.call('ZADD', k.due, due, job_id)
  -- Listed by µs (exact in a Lua number): jobs created in the same ms still list newest first.
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('ZADD', k.all, us, job_id)
  redis.call('ZADD', k.by, us, job_id)
  redis.call('ZADD', k.open, us, job_id)
  count_job(k.counts, tool, 'queued')
end
"""

# A request id seen before answers with its job (`existing`, the same body) or `conflict`, before
# any limit. Then: Redis out of room for new work, a due time past the horizon, the principal's
# limit on unfinished jobs (those of this partition: all of them for a principal with a quota),
# its rate (the quota's bucket, charged as a call would be: only in its home partition).
# Every key is in the job's partition (JobStore.new_job_id).
# KEYS: job, due set, owner's jobs, owner's open jobs, owner's bucket, every job, job counts, [idempotency]
# ARGV: job_id, fingerprint, tool, run_at ms or '', delay ms, horizon ms, max open here (0: none),
#       rate interval µs (0: none), tolerance µs, '1' if Redis has room, then the job's fields
CREATE = Script("CREATE_JOB", NEW_WORK + NOW + QUOTA + CREATE_JOB + """
if #KEYS == 8 then
  local held = redis.call('GET', KEYS[8])
  if held then
    local sep = string.find(held, ' ', 1, true)
    local other = string.sub(held, 1, sep - 1)
    if string.sub(held, sep + 1) ~= ARGV[2] then return {'conflict', other} end
    return {'existing', other}
  end
end
if ARGV[10] ~= '1' then return {'store_full'} end
local run_at = now + tonumber(ARGV[5])
if ARGV[4] ~= '' then run_at = tonumber(ARGV[4]) end
-- In digits, not tostring's: past 1e14 ms (a run_at in year 9999, a delay_ms of 2^70) Lua's
-- tostring writes an exponent, which the reply's reader could not take for a count of ms.
if run_at - now > tonumber(ARGV[6]) then return {'too_far', string.format('%.0f', run_at - now)} end
local max_open = tonumber(ARGV[7])
if max_open > 0 then
  local open = redis.call('ZCARD', KEYS[4])
  if open >= max_open then return {'limited', 'jobs', 1000, tostring(open)} end
end
local interval = tonumber(ARGV[8])
if interval > 0 then
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local refused = quota_refusal('', KEYS[5], 0, interval, tonumber(ARGV[9]), now, now_us)
  if refused then return refused end
  quota_charge('', '', '', KEYS[5], 0, interval, now_us, 0, 0)
end
local fields = {}
for i = 11, #ARGV do table.insert(fields, ARGV[i]) end
if #KEYS == 8 then
  -- Kept while the job is: its conclusion gives it the job's retention.
  redis.call('SET', KEYS[8], ARGV[1] .. ' ' .. ARGV[2])
  table.insert(fields, 'idem_key') table.insert(fields, KEYS[8])
end
local k = {job = KEYS[1], due = KEYS[2], by = KEYS[3], open = KEYS[4], all = KEYS[6], counts = KEYS[7]}
create_job(k, ARGV[1], ARGV[3], fields, math.max(run_at, now), run_at, now)
return {'new', ARGV[1]}
""")

# Lua: a job reaches a finished status: out of the due and open sets, kept for its retention
# (a dead letter for its own), and so is the request id that created it. Its listings forget it
# once it has expired (`keys.jobs_expiring`, swept by the job loops: `forget_expired`).
# `k`: the job's partition's keys (job, due, open, callbacks, dead, expiring, counts).
FINISH_JOB = LUA_COUNT_JOB + """
-- A job that asked to be told of this status gets its callback due now, in the same script (a
-- crash cannot lose it): `notify_id` is its webhook-id, the same for every delivery attempt.
local function finish_job(k, job_id, tool, status, idem, now)
  local job = k.job
  redis.call('HSET', job, 'status', status, 'finished_at', now, 'updated_at', now)
  local n = redis.call('HMGET', job, 'notify_url', 'notify_events', 'attempts')
  if n[1] and string.find(' ' .. (n[2] or '') .. ' ', ' ' .. status .. ' ', 1, true) then
    redis.call('HSET', job, 'notify_state', 'pending', 'notify_since', now, 'notify_tries', 0,
               'notify_id', 'msg_' .. job_id .. '_' .. status .. '_' .. (n[3] or '0'))
    redis.call('ZADD', k.callbacks, now, job_id)
  end
  redis.call('ZREM', k.due, job_id)
  redis.call('ZREM', k.open, job_id)
  local keep = redis.call('HMGET', job, 'retention', 'dead_retention', 'owner')
  local ttl = tonumber(keep[1]) or 604800
  if status == 'dead_lettered' then
    ttl = tonumber(keep[2]) or ttl
    redis.call('ZADD', k.dead, now, job_id)
  end
  redis.call('EXPIRE', job, ttl)
  if idem ~= '' then redis.call('EXPIRE', idem, ttl) end
  redis.call('ZADD', k.expiring, now + ttl * 1000, job_id .. ' ' .. (keep[3] or ''))
  count_job(k.counts, tool, status)
end
"""

# A caller cancels its job: one that waits is cancelled here and now; a running one is marked,
# and its execution (returned) is cancelled by the caller (store.verdicts.CANCEL): the job loop
# then concludes it `cancelled`, unless it had already succeeded.
# KEYS (the job's partition): job, due set, owner's open jobs, idempotency (or the job again),
#       callbacks due, dead letters, expiring, job counts
# ARGV: job_id
CANCEL_JOB = Script("CANCEL_JOB", ACCEPTED_WORK + NOW + FINISH_JOB + """
local h = redis.call('HMGET', KEYS[1], 'status', 'exec', 'tool')
if not h[1] then return {'gone'} end
if h[1] == 'queued' then
  redis.call('HSET', KEYS[1], 'cancel', '1')
  local k = {job = KEYS[1], due = KEYS[2], open = KEYS[3], callbacks = KEYS[5], dead = KEYS[6],
             expiring = KEYS[7], counts = KEYS[8]}
  finish_job(k, ARGV[1], h[3], 'cancelled', KEYS[4] ~= KEYS[1] and KEYS[4] or '', now)
  return {'cancelled'}
end
if h[1] == 'running' then
  redis.call('HSET', KEYS[1], 'cancel', '1', 'updated_at', now)
  return {'running', h[2]}
end
return {'finished'}
""")

# An operator queues a failed or dead-lettered job again, due now, with a fresh budget of
# attempts (its attempts go on being numbered from where they were: each keeps its request id).
# KEYS (the job's partition): job, due set, owner's open jobs, idempotency (or the job again),
#       dead letters, expiring, job counts
# ARGV: job_id
RETRY_JOB = Script("RETRY_JOB", ACCEPTED_WORK + NOW + LUA_COUNT_JOB + """
local h = redis.call('HMGET', KEYS[1], 'status', 'attempts', 'tool', 'created_at', 'owner')
if not h[1] then return 'gone' end
if h[1] ~= 'failed' and h[1] ~= 'dead_lettered' then return h[1] end
redis.call('HSET', KEYS[1], 'status', 'queued', 'base_attempts', h[2], 'due', now, 'updated_at', now)
redis.call('HDEL', KEYS[1], 'finished_at', 'cancel', 'result')  -- its result is the next final attempt's
redis.call('PERSIST', KEYS[1])
if KEYS[4] ~= KEYS[1] then redis.call('PERSIST', KEYS[4]) end
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1] .. ' ' .. (h[5] or ''))
redis.call('ZADD', KEYS[3], tonumber(h[4]) * 1000, ARGV[1])
redis.call('ZADD', KEYS[2], now, ARGV[1])
count_job(KEYS[7], h[3], 'queued')
return 'retried'
""")

# An operator purges a finished job (a dead letter, usually) before its retention is over: its
# hash, its request id and every list that names it go now. An unfinished job is left alone, and
# so is one whose callback is still being delivered ('notifying': the callback is not lost).
# KEYS (the job's partition): job, owner's jobs, idempotency (or the job again), every job,
#       dead letters, expiring
# ARGV: job_id, owner
PURGE_JOB = Script("PURGE_JOB", ACCEPTED_WORK + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 'gone' end
if status ~= 'succeeded' and status ~= 'failed' and status ~= 'dead_lettered' and status ~= 'cancelled' then
  return status
end
if redis.call('HGET', KEYS[1], 'notify_state') == 'pending' then return 'notifying' end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1] .. ' ' .. ARGV[2])
return 'purged'
""")

CreatedKind = Literal["new", "existing", "conflict", "limited", "too_far", "store_full"]


class Created(Struct):
    """What CREATE decided. ``new``/``existing`` (the request id's job, the same body) or
    ``conflict`` (another body): ``job_id``. Refused with nothing written: ``limited``
    (``limit`` is ``jobs``, the principal's unfinished jobs in the job's partition, ``count`` of
    them, or ``rate``;
    again after ``retry_after_ms``), ``too_far`` (due ``count`` ms ahead, past the horizon),
    ``store_full``."""

    kind: CreatedKind
    job_id: str = ""
    limit: str = ""
    retry_after_ms: int = 0
    count: int = 0


class JobState(Struct, kw_only=True):
    """A job as its hash holds it."""

    job_id: str
    tool: str
    owner: str
    status: JobStatus
    request_id: str | None
    attempts: int
    base_attempts: int
    max_attempts: int
    backoff_ms: int
    max_backoff_ms: int
    idempotent: bool
    run_at_ms: int
    due_ms: int
    created_ms: int
    executions: list[str]
    execution_id: str | None  # the current (or last) attempt's
    last_error: bytes | None  # JSON of an ErrorBody
    result: bytes | None  # the final attempt's result body (JSON)
    cancel: bool
    schedule: str | None
    idem_key: str
    notify: Notify | None = None

    @property
    def attempts_left(self) -> int:
        """Attempts it may still make (an operator's retry gives it a fresh budget)."""
        return self.max_attempts - (self.attempts - self.base_attempts)

    def view(self) -> JobView:
        return JobView(
            job_id=self.job_id, tool=self.tool, status=self.status, request_id=self.request_id,
            attempts=self.attempts, max_attempts=self.max_attempts,
            run_at=rfc3339(self.due_ms if self.status == "queued" else self.run_at_ms),
            created_at=rfc3339(self.created_ms),
            last_error=None if self.last_error is None else msgspec.Raw(self.last_error),
            result=None if self.result is None else msgspec.Raw(self.result),
            executions=self.executions, schedule=self.schedule,
            notify=None if self.notify is None else self.notify.view(),
        )


class Notify(Struct, kw_only=True):
    """A job's callback as its hash holds it: ``state`` '' while it waits for one of ``events``;
    ``message_id`` (its webhook-id) and ``tries`` once due; ``log``: the latest attempts (JSON
    of ``NotifyAttempt`` each)."""

    url: str
    events: list[str]
    state: str
    message_id: str
    tries: int
    log: list[bytes]

    def view(self) -> NotifyView:
        state = cast("NotifyState", self.state or "waiting")
        return NotifyView(url=self.url, events=self.events, state=state, delivered=state == "delivered",
                          deliveries=[attempt_decoder.decode(line) for line in self.log])


FIELDS = ["tool", "owner", "status", "request_id", "attempts", "base_attempts", "max_attempts", "backoff_ms",
          "max_backoff_ms", "idem", "run_at", "due", "created_at", "executions", "exec", "last_error", "result",
          "cancel", "schedule", "idem_key", "notify_url", "notify_events", "notify_state", "notify_id",
          "notify_tries", "notify_log"]


def parse(job_id: str, values: list[bytes | None]) -> JobState | None:
    """A job from ``HMGET job *FIELDS``; None if it does not exist (or expired)."""
    v = dict(zip(FIELDS, values, strict=True))
    if v["status"] is None or v["tool"] is None:
        return None

    def s(name: str) -> str | None:
        raw = v[name]
        return None if raw is None else raw.decode()

    def n(name: str) -> int:
        raw = v[name]
        return int(raw) if raw else 0

    return JobState(
        job_id=job_id, tool=s("tool") or "", owner=s("owner") or "", status=cast("JobStatus", s("status")),
        request_id=s("request_id"), attempts=n("attempts"), base_attempts=n("base_attempts"),
        max_attempts=n("max_attempts"), backoff_ms=n("backoff_ms"), max_backoff_ms=n("max_backoff_ms"),
        idempotent=v["idem"] == b"1", run_at_ms=n("run_at"), due_ms=n("due"), created_ms=n("created_at"),
        executions=(s("executions") or "").split(), execution_id=s("exec"), last_error=v["last_error"],
        result=v["result"], cancel=v["cancel"] == b"1", schedule=s("schedule"), idem_key=s("idem_key") or "",
        notify=None if v["notify_url"] is None else Notify(
            url=s("notify_url") or "", events=(s("notify_events") or "").split(), state=s("notify_state") or "",
            message_id=s("notify_id") or "", tries=n("notify_tries"),
            log=[line for line in (v["notify_log"] or b"").split(b"\n") if line]),
    )


def rfc3339(ms: int) -> str:
    """Unix ms as RFC 3339 in UTC, to the millisecond (``2026-12-02T10:00:00.000Z``), for the years
    1 to 9999. The year always has its four digits: ``strftime``'s ``%Y`` writes year 1 as ``1``
    (a job asked for ``0001-01-01T00:00:00Z`` shows that time)."""
    t = time.gmtime(ms // 1000)
    return (f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
            f".{ms % 1000:03d}Z")


def job_fields(*, tool: str, owner: str, payload: bytes, policy: RetryPolicy, max_attempts: int, idempotent: bool,
               retention: int, dead_retention: int, request_id: str | None, schedule: str = "",
               notify: tuple[str, list[str]] | None = None) -> list[Any]:
    """The parts of a new job's hash its creator knows (CREATE adds status, times, attempts):
    ``payload`` is its ``ExecutionJob`` (msgpack) with no execution id yet."""
    fields: list[Any] = [
        "tool", tool, "owner", owner, "max_attempts", max_attempts, "backoff_ms", round(policy.backoff * 1000),
        "max_backoff_ms", round(policy.max_backoff * 1000), "idem", "1" if idempotent else "",
        "retention", retention, "dead_retention", dead_retention, "payload", payload,
    ]
    if request_id is not None:
        fields += ["request_id", request_id]
    if schedule:
        fields += ["schedule", schedule]
    if notify is not None:
        fields += ["notify_url", notify[0], "notify_events", " ".join(notify[1])]
    return fields


class JobStore:
    """CREATE, reads, lists, CANCEL and RETRY of jobs, on one client."""

    def __init__(self, redis: Redis, *, durability: Durability | None = None) -> None:
        self.redis = redis
        self._create = bind(redis, CREATE, durability=durability)
        self._cancel = bind(redis, CANCEL_JOB, durability=durability)
        self._retry = bind(redis, RETRY_JOB, durability=durability)
        self._purge = bind(redis, PURGE_JOB, durability=durability)

    async def create(self, *, job_id: str, tool: str, owner: str, fields: list[Any], idempotency: str | None,
                     fingerprint: str, run_at_ms: int | None, delay_ms: int, horizon_ms: int, max_open: int,
                     quota: Quota = NO_QUOTA, room: bool = True) -> Created:
        """Queue a new job (``fields``: ``job_fields``) due at ``run_at_ms`` (unix ms) or
        ``delay_ms`` from now (Redis's clock), unless ``idempotency`` (``keys.job_idempotency``)
        names one already, or a limit refuses it. ``job_id`` is drawn by ``new_job_id`` (with the
        same ``quota`` and ``idempotency``). ``max_open`` is the owner's limit on unfinished jobs:
        exact if its quota is bounded (all its jobs are in its home partition), else each partition
        admits its ``keys.share`` of it, so that at most ``max_open + count - 1`` are open."""
        partition = keys.partition_of(job_id)
        drawn = self.job_partition(owner, quota, idempotency)
        if drawn is not None and partition != drawn:
            raise ValueError(f"job {job_id} is not in the partition JobStore.new_job_id draws it into")
        redis_keys = [keys.job(job_id), keys.job_due(tool, partition), keys.jobs_of(owner, partition),
                      keys.jobs_open(owner, partition), keys.quota_bucket(owner, partition), keys.jobs_all(partition),
                      metrics.jobs(partition)]
        if idempotency is not None:
            redis_keys.append(idempotency)
        here = max_open if quota.bounded else keys.share(max_open)
        args = [job_id, fingerprint, tool, "" if run_at_ms is None else run_at_ms, delay_ms, horizon_ms, here,
                quota.interval_us(), quota.tolerance_us(), "1" if room else "", *fields]
        try:
            answer = await self._create(keys=redis_keys, args=args)
        except OutOfMemoryError:  # refused whole at Redis's maxmemory: nothing was written
            return Created("store_full")
        kind = text(answer[0])
        if kind == "limited":
            return Created("limited", limit=text(answer[1]), retry_after_ms=int(answer[2]), count=int(answer[3]))
        if kind == "too_far":
            return Created("too_far", count=int(answer[1]))
        return Created(cast("CreatedKind", kind), text(answer[1]) if len(answer) > 1 else "")

    @staticmethod
    def new_job_id(owner: str, quota: Quota = NO_QUOTA, idempotency: str | None = None) -> str:
        """A new job id for ``owner``'s job (``idempotency``: its request id's key, made with
        ``homed=quota.bounded``), in ``job_partition``'s partition."""
        return keys.new_job_id(JobStore.job_partition(owner, quota, idempotency))

    @staticmethod
    def job_partition(owner: str, quota: Quota, idempotency: str | None) -> int | None:
        """Where ``owner``'s new job goes (None: any partition, drawn at random): its request id
        key's partition (so that a repeat finds its job in the same script; the home partition if
        the quota is bounded), else the home partition if the quota is bounded (its rate's bucket
        and its exact limit are there), else any."""
        home = keys.home_partition(owner)
        if idempotency is not None:
            partition = keys.partition_of_key(idempotency)
            if quota.bounded and partition != home:
                raise ValueError("a job request id of a principal with a quota is in its home partition "
                                 "(keys.job_idempotency(homed=True))")
            return partition
        return home if quota.bounded else None

    async def read(self, job_id: str) -> JobState | None:
        return (await self.read_many([job_id]))[0]

    async def read_many(self, job_ids: list[str]) -> list[JobState | None]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hmget(keys.job(job_id), FIELDS)
            rows = await pipe.execute()
        return [parse(job_id, row) for job_id, row in zip(job_ids, rows, strict=True)]

    async def list(self, *, owner: str | None, status: str | None, limit: int,
                   after: Cursor | None = None) -> Page:
        """Jobs newest first, after ``after``: ``owner``'s, or everyone's (None), every partition's
        merged (a principal's jobs spread unless it has a quota, and may have before it had one);
        only ``status`` if given (dead letters from their own sets). Looks at most a few pages
        past ``limit`` for a status that is rare, and forgets listed jobs whose hash expired."""
        if status == "dead_lettered":
            listings = [keys.jobs_dead(p) for p in keys.partitions()]
        elif owner is None:
            listings = [keys.jobs_all(p) for p in keys.partitions()]
        else:
            listings = [keys.jobs_of(owner, p) for p in keys.partitions()]
        return await listed(self.redis, self.read_many, listings, owner=owner, status=status, limit=limit,
                            after=after)

    async def forget_expired(self, partition: int, *, at_most: int = 500) -> int:
        """Take ``partition``'s jobs whose retention has run out off the lists that name them
        (everyone's, their owner's, the dead letters): their hashes are gone already. How many."""
        expiring = keys.jobs_expiring(partition)
        now_s, now_us = await self.redis.time()
        due = await self.redis.zrangebyscore(expiring, "-inf", now_s * 1000 + now_us // 1000, start=0, num=at_most)
        if not due:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for member in due:
                job_id, _, owner = member.decode().partition(" ")
                pipe.zrem(keys.jobs_all(partition), job_id)
                pipe.zrem(keys.jobs_of(owner, partition), job_id)
                pipe.zrem(keys.jobs_dead(partition), job_id)
                pipe.zrem(expiring, member)
            await pipe.execute()
        return len(due)

    async def cancel(self, job: JobState) -> tuple[Literal["gone", "cancelled", "running", "finished"], str | None]:
        """Cancel ``job``: at once if it waits; if it runs, marked, with the execution the
        caller must cancel; ``finished`` if it had already."""
        p = keys.partition_of(job.job_id)
        answer = await self._cancel(keys=[*self._keys(job), keys.callbacks_due(p), keys.jobs_dead(p),
                                          keys.jobs_expiring(p), metrics.jobs(p)], args=[job.job_id])
        kind = cast("Literal['gone', 'cancelled', 'running', 'finished']", text(answer[0]))
        return kind, text(answer[1]) if len(answer) > 1 and answer[1] else None

    async def retry(self, job: JobState) -> str:
        """An operator's retry of a failed or dead-lettered job: ``retried`` (it is queued again),
        or the status that keeps it from being retried (``gone`` if it no longer exists)."""
        p = keys.partition_of(job.job_id)
        return text(await self._retry(keys=[*self._keys(job), keys.jobs_dead(p), keys.jobs_expiring(p),
                                            metrics.jobs(p)], args=[job.job_id]))

    async def purge(self, job: JobState) -> str:
        """An operator's purge of a finished job: ``purged``, or the status that keeps it (``gone``
        if it no longer exists, ``notifying`` while its callback is still being delivered)."""
        p = keys.partition_of(job.job_id)
        return text(await self._purge(keys=[keys.job(job.job_id), keys.jobs_of(job.owner, p),
                                            job.idem_key or keys.job(job.job_id), keys.jobs_all(p), keys.jobs_dead(p),
                                            keys.jobs_expiring(p)], args=[job.job_id, job.owner]))

    @staticmethod
    def _keys(job: JobState) -> builtins.list[str]:
        """The job, its due set, its owner's open jobs and its request id (or the job again), in
        the job's partition."""
        p = keys.partition_of(job.job_id)
        return [keys.job(job.job_id), keys.job_due(job.tool, p), keys.jobs_open(job.owner, p),
                job.idem_key or keys.job(job.job_id)]
