"""SUBMIT: a new execution, in one round trip: the idempotency check, admission, the job and
the wake-up of the workers that serve it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Generator
from typing import Any, Literal, cast

from msgspec import Struct
from redis.asyncio import Redis
from redis.exceptions import OutOfMemoryError, RedisError

from carmy_worker.loop import first_done, running_loop
from carmy_worker.store import jobs, keys, staging
from carmy_worker.store.batch import Batch
from carmy_worker.store.durable import Durability
from carmy_worker.store.lua import NEW_WORK, NOW, text
from carmy_worker.store.memory import StoreMemory
from carmy_worker.store.quota import NO_QUOTA, QUOTA, Quota
from carmy_worker.store.scripts import Script, bind
from carmy_worker.wire import ExecutionJob, Record, msgpack_encoder, record_decoder

# KEYS: exe, pending, queued, arq job, arq queue, principal's pending set, principal's bucket,
#       staged job, [idempotency]: all of the execution's partition (its queue and wake list: the
#       group's there)
# ARGV: exec_id, fingerprint, arq job bytes ('' if staged), retention s, max pending, admission deadline ms,
#       queue wait ms, workers alive (1/0), tool, owner, idempotent (1/0), record prefix, wake list,
#       reply channel ('' for the execution's own channel: lua.EMIT), '1' if the caller streams,
#       the principal's pending limit (0: none), its bucket's interval and tolerance (µs; 0: no rate),
#       '1' if Redis has room for new work (store/memory.py), then what its audit entry tells
#       (store.audit): request id, principal, the door it came in by, the tool's effect
# A request id seen before is answered (replay, join, conflict) before any limit: a retry of an
# accepted call always gets its answer, and is never charged. Redis at its maxmemory refuses the
# whole script (lua.NEW_WORK): Submit answers store_full then too.
# A large job is not an argument (store.staging): the API has written it to the staged key
# just ahead, and the job is that key renamed (a value moved, not copied), or the staged key is
# dropped with any answer but `new`. Staged but gone (it outlived its TTL, or a failover or a
# slot's move lost it before SUBMIT ran): `unstaged`, nothing written, and the API sends the job
# inline.
SUBMIT = Script("SUBMIT", NEW_WORK + NOW + jobs.WAKE_ONE + QUOTA + staging.LUA_STAGED + """
local staged = ARGV[3] == ''
local function submit()
if #KEYS == 9 then
  local held = redis.call('GET', KEYS[9])
  if held then
    local sep = string.find(held, ' ', 1, true)
    local other = string.sub(held, 1, sep - 1)
    if string.sub(held, sep + 1) ~= ARGV[2] then return {'conflict', other} end
    local rec = redis.call('GET', ARGV[12] .. other)
    if rec then return {'replay', other, rec} end
    return {'join', other}
  end
end
if staged and not present(KEYS[8]) then return {'unstaged'} end
if ARGV[8] ~= '1' then return {'no_workers'} end
if ARGV[19] ~= '1' then return {'store_full'} end
local limit, interval = tonumber(ARGV[16]), tonumber(ARGV[17])
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
if limit > 0 or interval > 0 then
  local refused = quota_refusal(KEYS[6], KEYS[7], limit, interval, tonumber(ARGV[18]), now, now_us)
  if refused then return refused end
end
local now_s = int(now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_s)
local pending = redis.call('ZCARD', KEYS[2])
if pending >= tonumber(ARGV[5]) then return {'full', tostring(pending)} end
local retention = ARGV[4]
if #KEYS == 9 then
  redis.call('SET', KEYS[9], ARGV[1] .. ' ' .. ARGV[2], 'EX', retention)
end
local start_by = int(now + tonumber(ARGV[7]))
local fields = {'tool', ARGV[9], 'owner', ARGV[10], 'idem', ARGV[11], 'state', 'queued', 'attempt', '0',
                'start_by', start_by, 'wake', ARGV[13], 'queued_at', now_s,
                'rid', ARGV[20], 'principal', ARGV[21], 'via', ARGV[22], 'effect', ARGV[23]}
if ARGV[14] ~= '' then
  table.insert(fields, 'reply') table.insert(fields, ARGV[14])
  table.insert(fields, 'stream') table.insert(fields, ARGV[15])
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], retention)
local deadline = int(now + tonumber(ARGV[6]))
redis.call('ZADD', KEYS[2], deadline, ARGV[1])
if limit > 0 or interval > 0 then
  quota_charge(KEYS[1], ARGV[1], KEYS[6], KEYS[7], limit, interval, now_us, deadline, tonumber(ARGV[6]))
end
redis.call('ZADD', KEYS[3], start_by, ARGV[1])
place(KEYS[8], KEYS[4], ARGV[3], retention)
redis.call('ZADD', KEYS[5], now_s, ARGV[1])
wake_one(ARGV[13])
return {'new', ARGV[1]}
end
local answer = submit()
if staged and answer[1] ~= 'new' then drop(KEYS[8]) end
return answer
""")

SubmitKind = Literal["new", "join", "replay", "conflict", "full", "limited", "no_workers", "store_full"]


class Submission(Struct):
    """What SUBMIT decided.

    ``new``: queued as ``execution_id``. With a request id seen before: ``replay`` (finished,
    ``record`` set), ``join`` (still running as ``execution_id``) or ``conflict`` (other tool or
    arguments; ``execution_id`` is the first one). Refused, with nothing written: ``full``
    (``pending`` executions already admitted), ``limited`` (the principal's quota: ``limit`` is
    ``pending``, with ``pending`` of its executions held, or ``rate``; try again after
    ``retry_after_ms``), ``no_workers`` or ``store_full`` (Redis is out of memory for new work:
    ``store.memory``).
    """

    kind: SubmitKind
    execution_id: str = ""
    record: Record | None = None
    pending: int = 0
    limit: str = ""
    retry_after_ms: int = 0


class Submit:
    """SUBMIT on one client, with the store-wide retention; ``memory``: the reading new work is
    admitted by (None: only Redis's own refusal at its limit)."""

    def __init__(self, redis: Redis, *, retention: int, durability: Durability | None = None,
                 memory: StoreMemory | None = None) -> None:
        # An API process under load submits many clients' calls at once: one write for them all.
        self._script = bind(redis, SUBMIT, durability=durability, batch=Batch(redis))
        self._redis = redis
        self.retention = retention
        self.memory = memory

    async def __call__(
        self, job: ExecutionJob, *, group: str, idempotent: bool, workers_alive: bool, max_pending: int,
        queue_wait_ms: int, admission_ms: int, reply: str = "", stream: bool = True, quota: Quota = NO_QUOTA,
        via: str = "http", effect: str = "",
    ) -> Submission:
        """``send``, waited for."""
        return await self.send(
            job, group=group, idempotent=idempotent, workers_alive=workers_alive, max_pending=max_pending,
            queue_wait_ms=queue_wait_ms, admission_ms=admission_ms, reply=reply, stream=stream, quota=quota,
            via=via, effect=effect)

    def send(
        self, job: ExecutionJob, *, group: str, idempotent: bool, workers_alive: bool, max_pending: int,
        queue_wait_ms: int, admission_ms: int, reply: str = "", stream: bool = True, quota: Quota = NO_QUOTA,
        via: str = "http", effect: str = "", track: bool = False,
    ) -> Pending:
        """Queue ``job`` for the workers of ``group`` (on their queue in its execution's
        partition) unless its request id was seen or admission refuses it: the SUBMIT is on its
        way when this returns (in this turn's batch), and the ``Pending`` it returns, awaited,
        is its outcome. With ``track``, ``Pending.written`` says when it has left for Redis.

        ``job.arguments`` is the canonical JSON its fingerprint is taken from. It may wait for a
        worker ``queue_wait_ms``; its admission slot is held at most ``admission_ms``. Its events
        go to ``reply`` (an API process's channel: ``keys.api_channel``), every event if
        ``stream`` else only the final one; without ``reply``, every event goes to its own
        channel (``keys.events``). ``quota``: the limits of ``job.principal``, checked and charged
        in the same round trip as the global ``max_pending``. ``via`` (the door it came in by)
        and ``effect`` (its tool's) are kept for its audit entry (``store.audit``).
        """
        exec_id, owner = job.execution_id, keys.owner(job.principal)
        partition = keys.partition_of(exec_id)
        queue = jobs.queue_name(group, partition)
        # Admission is counted per partition (``keys.share`` of max_pending): a script sees one slot.
        # A principal with a quota has every execution drawn into its home partition, where its
        # quota's keys are (``keys.request_partition``); another's are named here and never written.
        redis_keys = [keys.execution(exec_id), keys.pending(partition), keys.queued(partition), jobs.job_key(exec_id),
                      queue, keys.quota_pending(owner, partition), keys.quota_bucket(owner, partition),
                      jobs.staged_job_key(exec_id)]
        if job.request_id is not None:
            redis_keys.append(keys.idempotency(job.principal, job.session, job.request_id, partition))
        arq_job = jobs.encode_job(msgpack_encoder.encode(job), int(time.time() * 1000))
        memory = self.memory
        args = [
            # The fingerprint is only compared with a request id's (an idempotency record).
            exec_id, keys.fingerprint(job.tool, job.arguments) if job.request_id is not None else "", arq_job,
            self.retention, keys.share(max_pending), admission_ms,
            queue_wait_ms, 1 if workers_alive else 0, job.tool, owner, 1 if idempotent else 0,
            keys.record_prefix(partition), jobs.wake_list(queue), reply, "1" if stream else "",
            quota.pending, quota.interval_us(), quota.tolerance_us(), "1" if memory is None or memory.room else "",
            job.request_id or "", job.principal or "", via, effect,
        ]
        # Only a batched call says when it has left: another is sent when awaited.
        sent = running_loop().create_future() if track and self._script.batched else None
        if not staging.staged(arq_job):
            return Pending(self._script.queue(redis_keys, args, sent=sent), sent, memory)
        stage = redis_keys[7]
        submitted = self._script.queue(redis_keys, [*args[:2], "", *args[3:]], sent=sent,
                                       before=staging.stage(stage, arq_job))
        return Pending(running_loop().create_task(self._staged(submitted, stage, redis_keys, args)), sent, memory)

    async def _staged(self, staged: Awaitable[Any], stage: str, redis_keys: list[Any], args: list[Any]) -> Any:
        """The reply of a large job's SUBMIT, sent right behind the ``SET`` of its staged key (in
        the same write, when batched); sent again with the job inline if SUBMIT found the staged
        key gone (``unstaged``)."""
        try:
            answer = await staged
        except OutOfMemoryError:
            # Redis refused SUBMIT whole, at its maxmemory, maybe after taking the SET: nothing
            # else drops the staged job before its TTL.
            with contextlib.suppress(RedisError, OSError):
                await self._redis.delete(stage)
            raise
        if text(answer[0]) != "unstaged":
            return answer
        return await self._script.queue(redis_keys, args)


class Pending:
    """A SUBMIT sent (or, not batched, to be sent when awaited): awaited, its ``Submission``."""

    __slots__ = ("_memory", "_reply", "_sent")

    def __init__(self, reply: Awaitable[Any], sent: asyncio.Future[None] | None, memory: StoreMemory | None) -> None:
        self._reply = reply
        self._sent = sent
        self._memory = memory

    async def written(self) -> bool:
        """Until the SUBMIT has been written to Redis (True), or has failed or been answered
        first (False: so it is when it was not tracked, or not batched). Redis reads a
        connection's commands before any a caller could send once told of the execution: from
        then on, whoever asks Redis about it asks after the SUBMIT has run. Cancelled before the
        SUBMIT was written, it is never sent."""
        sent, reply = self._sent, self._reply
        if sent is None:
            return False
        assert isinstance(reply, asyncio.Future)  # tracked: a batched call's future (Submit.send)
        if not sent.done() and not reply.done():
            try:
                await first_done(sent, reply)
            except asyncio.CancelledError:
                if not sent.done():  # as for a caller cancelled while awaiting it: never sent, never run
                    reply.cancel()
                raise
        return sent.done()

    def __await__(self) -> Generator[Any, None, Submission]:
        return self._outcome().__await__()

    async def _outcome(self) -> Submission:
        memory = self._memory
        try:
            submission = _parse(await self._reply)
        except OutOfMemoryError:  # Redis at its maxmemory refused it whole: nothing was written
            if memory is not None:
                memory.refused(overflow=True)
            return Submission("store_full")
        if submission.kind == "store_full" and memory is not None:
            memory.refused()
        return submission


def _parse(answer: list[Any]) -> Submission:
    kind = text(answer[0])
    if kind == "replay":
        return Submission("replay", text(answer[1]), record_decoder.decode(answer[2]))
    if kind == "full":
        return Submission("full", pending=int(answer[1]))
    if kind == "limited":
        return Submission("limited", pending=int(answer[3]), limit=text(answer[1]), retry_after_ms=int(answer[2]))
    return Submission(cast("SubmitKind", kind), text(answer[1]) if len(answer) > 1 else "")
