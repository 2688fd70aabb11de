"""Jobs in Redis: the calls of ``/agent/jobs`` that run later, again after a failure that may
pass, or on a schedule. (Not arq's jobs: ``store.jobs`` is the queue's layout.)

A job is a hash (``keys.job``) that outlives its executions. While ``queued`` it waits in its
tool's due set (``keys.job_due``, scored by when it is due); once due, a worker serving the tool
promotes it to an execution like any other (``store.promotion``: one script writes the
execution, its arq job and the job's new attempt together, so an attempt is started at most
once whatever the number of workers). The execution's record, when SETTLE or an imposed
verdict writes it, lists the execution in ``keys.JOBS_SETTLED``; a worker's job loop then
concludes the attempt: the job is finished (``succeeded``, ``failed``, ``dead_lettered``,
``cancelled``) or due again after a backoff.

This module is the API's side, and what both sides share: CREATE (also run by a schedule's
FIRE), reads, lists, CANCEL and an operator's RETRY.
"""

from __future__ import annotations

import builtins
import time
from typing import Any, Literal, cast

import msgspec
from msgspec import Struct
from redis.asyncio import Redis
from redis.exceptions import OutOfMemoryError

from carmy_worker.store import keys
from carmy_worker.store.durable import Durability
from carmy_worker.store.lua import ACCEPTED_WORK, NEW_WORK, NOW, text
from carmy_worker.store.metrics import LUA_COUNT_JOB
from carmy_worker.store.quota import NO_QUOTA, QUOTA, Quota
from carmy_worker.store.scripts import Script, bind
from carmy_worker.wire import JobStatus, JobView, NotifyAttempt, NotifyState, NotifyView, RetryPolicy

FINISHED: frozenset[str] = frozenset({"succeeded", "failed", "dead_lettered", "cancelled"})
attempt_decoder = msgspec.json.Decoder(NotifyAttempt)

# Lua: a new job, queued: its hash (`fields` are its parts from the caller, then what this adds),
# due at `due` in its tool's due set, and listed (everyone's, its owner's, its owner's open ones:
# job -> created, µs).
# Unfinished jobs never expire; a finished one expires with its retention (store.promotion).
CREATE_JOB = LUA_COUNT_JOB + f"""
local function create_job(job, due_set, by, open, job_id, tool, fields, due, run_at, now)
  table.insert(fields, 'status') table.insert(fields, 'queued')
  table.insert(fields, 'due') table.insert(fields, due)
  table.insert(fields, 'run_at') table.insert(fields, run_at)
  table.insert(fields, 'created_at') table.insert(fields, now)
  table.insert(fields, 'updated_at') table.insert(fields, now)
  table.insert(fields, 'attempts') table.insert(fields, 0)
  table.insert(fields, 'base_attempts') table.insert(fields, 0)
  redis.call('HSET', job, unpack(fields))
  redis.call('ZADD', due_set, due, job_id)
  -- Listed by µs (exact in a Lua number): jobs created in the same ms still list newest first.
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('ZADD', '{keys.JOBS_ALL}', us, job_id)
  redis.call('ZADD', by, us, job_id)
  redis.call('ZADD', open, us, job_id)
  count_job(tool, 'queued')
end
"""

# A request id seen before answers with its job (`existing`, the same body) or `conflict`, before
# any limit. Then: Redis out of room for new work, a due time past the horizon, the principal's
# limit on unfinished jobs, its rate (the quota's bucket, charged as a call would be).
# KEYS: job, due set, owner's jobs, owner's open jobs, owner's bucket, [idempotency]
# ARGV: job_id, fingerprint, tool, run_at ms or '', delay ms, horizon ms, max open (0: none),
#       rate interval µs (0: none), tolerance µs, '1' if Redis has room, then the job's fields
CREATE = Script("CREATE_JOB", NEW_WORK + NOW + QUOTA + CREATE_JOB + """
if #KEYS == 6 then
  local held = redis.call('GET', KEYS[6])
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
if run_at - now > tonumber(ARGV[6]) then return {'too_far', tostring(run_at - now)} end
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
if #KEYS == 6 then
  -- Kept while the job is: its conclusion gives it the job's retention.
  redis.call('SET', KEYS[6], ARGV[1] .. ' ' .. ARGV[2])
  table.insert(fields, 'idem_key') table.insert(fields, KEYS[6])
end
create_job(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[3], fields, math.max(run_at, now), run_at, now)
return {'new', ARGV[1]}
""")

# Lua: a job reaches a finished status: out of the due and open sets, kept for its retention
# (a dead letter for its own), and so is the request id that created it. Its listings forget it
# once it has expired (`keys.JOBS_EXPIRING`, swept by the job loops: `forget_expired`).
FINISH_JOB = LUA_COUNT_JOB + f"""
-- A job that asked to be told of this status gets its callback due now, in the same script (a
-- crash cannot lose it): `notify_id` is its webhook-id, the same for every delivery attempt.
local function finish_job(job, job_id, tool, status, open, due_set, idem, now, callbacks)
  redis.call('HSET', job, 'status', status, 'finished_at', now, 'updated_at', now)
  local n = redis.call('HMGET', job, 'notify_url', 'notify_events', 'attempts')
  if n[1] and string.find(' ' .. (n[2] or '') .. ' ', ' ' .. status .. ' ', 1, true) then
    redis.call('HSET', job, 'notify_state', 'pending', 'notify_since', now, 'notify_tries', 0,
               'notify_id', 'msg_' .. job_id .. '_' .. status .. '_' .. (n[3] or '0'))
    redis.call('ZADD', callbacks, now, job_id)
  end
  redis.call('ZREM', due_set, job_id)
  redis.call('ZREM', open, job_id)
  local keep = redis.call('HMGET', job, 'retention', 'dead_retention', 'owner')
  local ttl = tonumber(keep[1]) or 604800
  if status == 'dead_lettered' then
    ttl = tonumber(keep[2]) or ttl
    redis.call('ZADD', '{keys.JOBS_DEAD}', now, job_id)
  end
  redis.call('EXPIRE', job, ttl)
  if idem ~= '' then redis.call('EXPIRE', idem, ttl) end
  redis.call('ZADD', '{keys.JOBS_EXPIRING}', now + ttl * 1000, job_id .. ' ' .. (keep[3] or ''))
  count_job(tool, status)
end
"""

# A caller cancels its job: one that waits is cancelled here and now; a running one is marked,
# and its execution (returned) is cancelled by the caller (store.verdicts.CANCEL): the job loop
# then concludes it `cancelled`, unless it had already succeeded.
# KEYS: job, due set, owner's open jobs, idempotency (or the job again), callbacks due
# ARGV: job_id
CANCEL_JOB = Script("CANCEL_JOB", ACCEPTED_WORK + NOW + FINISH_JOB + """
local h = redis.call('HMGET', KEYS[1], 'status', 'exec', 'tool')
if not h[1] then return {'gone'} end
if h[1] == 'queued' then
  redis.call('HSET', KEYS[1], 'cancel', '1')
  finish_job(KEYS[1], ARGV[1], h[3], 'cancelled', KEYS[3], KEYS[2], KEYS[4] ~= KEYS[1] and KEYS[4] or '', now,
             KEYS[5])
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
# KEYS: job, due set, owner's open jobs, idempotency (or the job again)
# ARGV: job_id
RETRY_JOB = Script("RETRY_JOB", ACCEPTED_WORK + NOW + LUA_COUNT_JOB + f"""
local h = redis.call('HMGET', KEYS[1], 'status', 'attempts', 'tool', 'created_at', 'owner')
if not h[1] then return 'gone' end
if h[1] ~= 'failed' and h[1] ~= 'dead_lettered' then return h[1] end
redis.call('HSET', KEYS[1], 'status', 'queued', 'base_attempts', h[2], 'due', now, 'updated_at', now)
redis.call('HDEL', KEYS[1], 'finished_at', 'cancel', 'result')  -- its result is the next final attempt's
redis.call('PERSIST', KEYS[1])
if KEYS[4] ~= KEYS[1] then redis.call('PERSIST', KEYS[4]) end
redis.call('ZREM', '{keys.JOBS_DEAD}', ARGV[1])
redis.call('ZREM', '{keys.JOBS_EXPIRING}', ARGV[1] .. ' ' .. (h[5] or ''))
redis.call('ZADD', KEYS[3], tonumber(h[4]) * 1000, ARGV[1])
redis.call('ZADD', KEYS[2], now, ARGV[1])
count_job(h[3], 'queued')
return 'retried'
""")

# An operator purges a finished job (a dead letter, usually) before its retention is over: its
# hash, its request id and every list that names it go now. An unfinished job is left alone, and
# so is one whose callback is still being delivered ('notifying': the callback is not lost).
# KEYS: job, owner's jobs, idempotency (or the job again)
# ARGV: job_id, owner
PURGE_JOB = Script("PURGE_JOB", ACCEPTED_WORK + f"""
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 'gone' end
if status ~= 'succeeded' and status ~= 'failed' and status ~= 'dead_lettered' and status ~= 'cancelled' then
  return status
end
if redis.call('HGET', KEYS[1], 'notify_state') == 'pending' then return 'notifying' end
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('ZREM', '{keys.JOBS_ALL}', ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', '{keys.JOBS_DEAD}', ARGV[1])
redis.call('ZREM', '{keys.JOBS_EXPIRING}', ARGV[1] .. ' ' .. ARGV[2])
return 'purged'
""")

CreatedKind = Literal["new", "existing", "conflict", "limited", "too_far", "store_full"]


class Created(Struct):
    """What CREATE decided. ``new``/``existing`` (the request id's job, the same body) or
    ``conflict`` (another body): ``job_id``. Refused with nothing written: ``limited``
    (``limit`` is ``jobs``, the principal's unfinished jobs, ``count`` of them, or ``rate``;
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
    """Unix ms as RFC 3339 in UTC, to the millisecond (``2026-12-02T10:00:00.000Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


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
        names one already, or a limit refuses it."""
        redis_keys = [keys.job(job_id), keys.job_due(tool), keys.jobs_of(owner), keys.jobs_open(owner),
                      keys.quota_bucket(owner, 0)]
        if idempotency is not None:
            redis_keys.append(idempotency)
        args = [job_id, fingerprint, tool, "" if run_at_ms is None else run_at_ms, delay_ms, horizon_ms, max_open,
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

    async def read(self, job_id: str) -> JobState | None:
        return (await self.read_many([job_id]))[0]

    async def read_many(self, job_ids: list[str]) -> list[JobState | None]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hmget(keys.job(job_id), FIELDS)
            rows = await pipe.execute()
        return [parse(job_id, row) for job_id, row in zip(job_ids, rows, strict=True)]

    async def list(self, *, owner: str | None, status: str | None, limit: int) -> builtins.list[JobState]:
        """Jobs newest first: ``owner``'s, or everyone's (None); only ``status`` if given
        (dead letters from their own set). Looks at most a few pages past ``limit`` for a
        status that is rare, and forgets listed jobs whose hash expired."""
        if status == "dead_lettered":
            listing = keys.JOBS_DEAD
        elif owner is None:
            listing = keys.JOBS_ALL
        else:
            listing = keys.jobs_of(owner)
        found: list[JobState] = []
        start, page = 0, max(limit, 50)
        while len(found) < limit and start < 20 * page:
            ids = [raw.decode() for raw in await self.redis.zrevrange(listing, start, start + page - 1)]
            if not ids:
                break
            states = await self.read_many(ids)
            gone = [job_id for job_id, state in zip(ids, states, strict=True) if state is None]
            if gone:
                await self.redis.zrem(listing, *gone)
            start += page - len(gone)
            for state in states:
                if state is None or (status is not None and state.status != status):
                    continue
                if owner is not None and state.owner != owner:
                    continue
                found.append(state)
                if len(found) == limit:
                    break
        return found

    async def forget_expired(self, *, at_most: int = 500) -> int:
        """Take the jobs whose retention has run out off the lists that name them (everyone's,
        their owner's, the dead letters): their hashes are gone already. How many."""
        now_s, now_us = await self.redis.time()
        due = await self.redis.zrangebyscore(keys.JOBS_EXPIRING, "-inf", now_s * 1000 + now_us // 1000,
                                             start=0, num=at_most)
        if not due:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for member in due:
                job_id, _, owner = member.decode().partition(" ")
                pipe.zrem(keys.JOBS_ALL, job_id)
                pipe.zrem(keys.jobs_of(owner), job_id)
                pipe.zrem(keys.JOBS_DEAD, job_id)
                pipe.zrem(keys.JOBS_EXPIRING, member)
            await pipe.execute()
        return len(due)

    async def cancel(self, job: JobState) -> tuple[Literal["gone", "cancelled", "running", "finished"], str | None]:
        """Cancel ``job``: at once if it waits; if it runs, marked, with the execution the
        caller must cancel; ``finished`` if it had already."""
        answer = await self._cancel(keys=self._keys(job), args=[job.job_id])
        kind = cast("Literal['gone', 'cancelled', 'running', 'finished']", text(answer[0]))
        return kind, text(answer[1]) if len(answer) > 1 and answer[1] else None

    async def retry(self, job: JobState) -> str:
        """An operator's retry of a failed or dead-lettered job: ``retried`` (it is queued again),
        or the status that keeps it from being retried (``gone`` if it no longer exists)."""
        return text(await self._retry(keys=self._keys(job), args=[job.job_id]))

    async def purge(self, job: JobState) -> str:
        """An operator's purge of a finished job: ``purged``, or the status that keeps it (``gone``
        if it no longer exists)."""
        return text(await self._purge(keys=[keys.job(job.job_id), keys.jobs_of(job.owner),
                                            job.idem_key or keys.job(job.job_id)], args=[job.job_id, job.owner]))

    @staticmethod
    def _keys(job: JobState) -> builtins.list[str]:
        return [keys.job(job.job_id), keys.job_due(job.tool), keys.jobs_open(job.owner),
                job.idem_key or keys.job(job.job_id), keys.CALLBACKS_DUE]
