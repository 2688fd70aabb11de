"""The one module that knows arq.

arq gives us the queue layout, its job runner (``run_job``: timeout, Retry, cancellation) and
graceful shutdown. Everything else (records, events, fencing) is ours, so replacing arq later
means rewriting this file only. Four things differ from arq's defaults:

* jobs are msgpack (msgspec), never pickle;
* the API writes jobs itself, inside the same Lua script that reserves idempotency and
  admission (one round trip), in exactly the layout ``ArqRedis.enqueue_job`` would write
  (``carmy_worker.store.jobs``, which does not import arq);
* workers block on the queue's wake list (``BLPOP``) instead of sleeping 0.5 s between polls:
  whatever makes a job due (SUBMIT, a job put back) pushes one token, so one job wakes one idle
  worker (not every worker of the pool), within milliseconds. A full worker whose slot frees up
  looks again at once; the 0.5 s poll stays as a fallback (deferred jobs come due that way).
  Due jobs are taken with one Lua call (LEASE) instead of arq's four round trips per job, sent
  in the same pipeline as the ``BLPOP``: Redis runs it as soon as the token is popped. It also
  reads the job, so arq's ``run_job`` reads it from the lease (its first pipeline, which would
  count the job's runs in arq's retry key, is answered in memory: our execution hash counts
  attempts, and arq's own limit is out of the way),
  moves the job's score to the lease's end, so later scans skip it, and claims the job's
  execution for this worker (``store.attempts.CLAIM_ONE``: no CLAIM round trip);
* each lease holds a token (in arq's in-progress key and the worker's leases hash), and FINISH
  replaces arq's ``finish_job``: it ends only its own lease, so a worker that lost a job while
  paused cannot delete it, and the janitor can hand back the leases of a dead worker. A job
  settled with its record ends its lease in the same script (SETTLE, ``store.attempts``), so
  ``finish_job`` then has nothing left to do: a job costs an idle worker two round trips
  (``BLPOP`` with LEASE, then SETTLE), and a full one with jobs waiting one: the SETTLE of a
  slot's job carries the LEASE of its next (``Leases.hand_over``), which starts as soon as the
  reply is read, in a task of its own that takes over the slot of arq's count
  (``WakeableWorker._take_over``), while arq's run_job still ends the job before it.

The last two override arq internals. ``ARQ_PRIVATE_SURFACE`` names every private or
undocumented name of arq this module relies on; ``tests/carmy_worker/runtime/test_arq_surface.py``
fails loudly when an arq release changes one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from signal import Signals
from typing import TYPE_CHECKING, Any, cast

import msgspec
from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix
from arq.worker import Retry, Worker, func
from msgspec import Struct
from redis._parsers.hiredis import NOT_ENOUGH_DATA
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from carmy_worker.loop import first_done
from carmy_worker.store import jobs, keys
from carmy_worker.store.attempts import CLAIM_ONE, MAX_ATTEMPTS, Claim, ClaimVerdict
from carmy_worker.store.batch import FollowUp
from carmy_worker.store.checkout import buffered_reply
from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.durable import Durability, durable
from carmy_worker.store.lua import ACCEPTED_WORK

if TYPE_CHECKING:
    from arq.typing import StartupShutdown

log = logging.getLogger("carmy.queue")

# arq retries jobs itself; we count attempts in our own execution hash and settle repeated
# interruptions there, so arq's own limit only has to be out of the way.
_ARQ_MAX_TRIES = 1000

# How long arq's run_job keeps its count of a job's runs (its pipeline's EXPIRE, answered from
# the lease: the count is not kept, see _AnsweredPipeline).
_ARQ_RETRY_TTL_S = 88400

# What WakeableWorker uses of arq beyond its documented API (Worker(...), async_run, close,
# func, Retry, ArqRedis): attributes it reads or writes and methods it overrides or calls.
ARQ_PRIVATE_SURFACE: dict[str, tuple[str, ...]] = {
    "arq.worker.Worker methods overridden": (
        "main", "handle_sig_wait_for_completion", "_release_sem_dec_counter_on_complete",
        "finish_job", "finish_failed_job",
    ),
    "arq.worker.Worker methods called": ("run_job", "heart_beat"),
    "arq.worker.Worker attributes": (
        "_pool", "pool", "ctx", "on_startup", "allow_pick_jobs", "max_jobs", "job_counter", "sem", "tasks",
        "loop", "queue_name", "in_progress_timeout_s", "queue_read_limit", "poll_delay_s", "allow_abort_jobs",
        "main_task",
    ),
    # The property WakeableWorker overrides so that run_job's first pipeline, these statements of
    # its source (allow_abort_jobs off), is answered from what LEASE read.
    "arq.worker.Worker properties overridden": ("pool",),
    "arq.worker.Worker.run_job statements": (
        "async with self.pool.pipeline(transaction=True) as pipe:",
        "pipe.get(job_key_prefix + job_id)",
        "pipe.incr(retry_key_prefix + job_id)",
        f"pipe.expire(retry_key_prefix + job_id, {_ARQ_RETRY_TTL_S})",
        "v, job_try, _ = await pipe.execute()",
        # finish_job's result is shielded, not awaited itself: a done future goes through as it is.
        "await asyncio.shield(\n            self.finish_job(",
    ),
    # The job layout store.jobs writes without arq: key prefixes, and the job dict's fields.
    "arq.constants": ("job_key_prefix", "in_progress_key_prefix", "retry_key_prefix"),
    "arq.jobs.deserialize_job_raw fields": ("t", "f", "a", "k", "et"),
}

if (job_key_prefix, in_progress_key_prefix, retry_key_prefix) != (
        jobs.JOB_KEY_PREFIX, jobs.IN_PROGRESS_KEY_PREFIX, jobs.RETRY_KEY_PREFIX):
    raise ImportError("this arq writes jobs under other keys than carmy_worker.store.jobs: pin arq==0.28.*")

_encoder = msgspec.msgpack.Encoder(enc_hook=repr)  # arq may hand us exceptions to store
_decoder = msgspec.msgpack.Decoder()


def serialize(obj: dict[str, Any]) -> bytes:
    return _encoder.encode(obj)


def deserialize(data: bytes) -> dict[str, Any]:
    return _decoder.decode(data)  # type: ignore[no-any-return]


# (job payload, lease token, the LEASE to send right behind its SETTLE or None) -> whether its
# SETTLE also ended the lease (then nothing is left to finish)
Handler = Callable[[bytes, str, FollowUp | None], Awaitable[bool | None]]
# (job payload, the claim LEASE made, lease token, when LEASE was sent: time.monotonic()), called
# as soon as LEASE answers, before arq's run_job gets to the job: the worker holds the execution
# from then on.
Admit = Callable[[bytes, Claim, str, float], None]

# Takes up to ARGV[2] jobs in one round trip: the due ones at the head of the queue (by Redis's
# clock, like the scores SUBMIT writes) that no other worker has leased. arq polls with the
# worker's clock, then takes each job with WATCH/EXISTS/ZSCORE/MULTI/EXEC (four round trips
# each). The in-progress keys set here are arq's, holding a token unique to this lease, also
# listed in the worker's leases hash: the janitor puts back the jobs of a dead worker, and a late
# finish of a lease that was taken away touches nothing.
# Each job leased is also read (arq's job bytes, '' if gone), so run_job needs no round trip of
# its own (arq's count of its runs, in its retry key, is not kept: see _AnsweredPipeline); its
# score moves to the end of its lease, when it is due again unless finished, so that the scan for
# due jobs does not walk over leased ones (whoever ends a lease early without finishing the job
# puts the score back: FINISH, REAP, the janitor, a heartbeat); and, if it was there to read, its
# execution is claimed (store.attempts.CLAIM_ONE), so the worker needs no CLAIM round trip either.
# Then the wake list holds one token per job still due and unleased that it looked at
# (jobs.WAKE_FOR), unless ARGV[9] is '1': a LEASE sent with a SETTLE (Leases.hand_over) looks
# only a few jobs down the queue, and leaves the tokens as they are (one too many, at most, for
# the job it took: an idle worker woken for nothing looks further, and sets them right).
# Returns {id, score before, job, verdict ('' if not claimed), attempt, ms waited, id, ...}.
# KEYS: queue, leases hash, wake list, running set
# ARGV: in-progress key prefix, how many, lease ms, how far down the queue to look, token prefix,
#       job key prefix, worker_id, max attempts, '1' to leave the wake list alone
LEASE = ACCEPTED_WORK + CLAIM_ONE + jobs.WAKE_FOR + """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[4]))
local leased, want, lease_end, waiting = {}, tonumber(ARGV[2]) * 6, now + tonumber(ARGV[3]), 0
local wake = ARGV[9] ~= '1'
for i = 1, #due, 2 do
  local job = due[i]
  local token = ARGV[5] .. job
  if #leased >= want then
    if not wake then break end  -- nothing to count the tokens for
    -- due, and takeable by another worker (a job another lease holds is not counted: no
    -- worker must be woken for it, again and again, while it runs)
    if redis.call('EXISTS', ARGV[1] .. job) == 0 then waiting = waiting + 1 end
  elseif redis.call('SET', ARGV[1] .. job, token, 'NX', 'PX', ARGV[3]) then
    redis.call('HSET', KEYS[2], job, token)
    redis.call('ZADD', KEYS[1], lease_end, job)
    local bytes = redis.call('GET', ARGV[6] .. job) or ''
    local verdict, attempt, waited = '', 0, 0
    if bytes ~= '' then
      verdict, attempt, waited = claim(job, ARGV[7], KEYS[4], tonumber(ARGV[8]))
    end
    for _, v in ipairs({job, due[i + 1], bytes, verdict, attempt, waited}) do table.insert(leased, v) end
  end
end
if wake then wake_for(KEYS[3], waiting) end
return leased
"""

# arq's finish_job and finish_failed_job, for one lease: only while the in-progress key still
# holds this lease's token. Finished: the job is gone; otherwise (a retry, a shutdown) it stays
# queued at score ARGV[4] (LEASE moved it to the lease's end): due at once, and one idle worker
# woken, unless deferred. A lease the janitor took away finishes as a no-op, so a paused worker
# waking up late cannot delete the job another worker now runs. (SETTLE ends the lease of a
# job it settled itself: FINISH is for every other end.)
# KEYS: in-progress, job, retry, queue, leases hash, wake list
# ARGV: job id, token, finished ('1' or ''), score to queue it at again, '1' to wake a worker
FINISH = ACCEPTED_WORK + jobs.WAKE_ONE + jobs.END_LEASE + """
local finished = ARGV[3] == '1'
if not end_lease(KEYS[5], KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], finished) then return 0 end
if not finished then
  redis.call('ZADD', KEYS[4], 'XX', ARGV[4], ARGV[1])
  if ARGV[5] == '1' then wake_one(KEYS[6]) end
end
return 1
"""

# Finishing a lease is retried through a Redis outage this long: a lease left behind would hold
# its job back until the in-progress key expires (the longest tool timeout and then some).
FINISH_RETRY_S = 60.0

# How far down the queue a LEASE sent with a SETTLE looks: past a job another worker's lease still
# holds, but not over the whole backlog (checking each job there is most of a full LEASE's cost).
HANDOFF_LOOK_AHEAD = 4

# Turns of the event loop the jobs a worker just started get before it waits for more: enough
# for arq's run_job, its task for the job, the tool's task and the batch that writes SETTLE.
START_TURNS = 6


class Lease(Struct, frozen=True):
    job_id: str
    score: int  # the job's score when it was leased (LEASE then moved it to the lease's end)
    token: str
    job: bytes = b""  # arq's job, as LEASE read it (empty: gone)
    runs: int = 1  # what arq's run_job is told of the job's runs: the attempt claimed, at least 1
    claim: Claim | None = None  # its execution's claim, made with the lease (None: job gone)
    sent_at: float = 0.0  # when LEASE was sent (time.monotonic); it may run later, its worker stopped


class Leases:
    """LEASE and FINISH for one worker's jobs, on one client."""

    def __init__(self, redis: ArqRedis, worker_id: str, *, durability: Durability | None = None) -> None:
        self._script = redis.register_script(LEASE)
        # It claims: a claim a failover loses resets the attempt count (store.durable).
        self._durability = durability if durability is not None and durability.replicas else None
        self._lease = durable(self._script, durability)
        self._finish = redis.register_script(FINISH)
        self.worker_id = worker_id
        self._hash = keys.leases(worker_id)
        self._running = keys.running(worker_id)
        # Each call's tokens get a prefix of their own: a late end of an earlier lease of the same
        # job never matches a later one. A counter, from a random start (two objects of one
        # worker id, in tests, do not collide), not a random draw per call: a system call each.
        self._calls = itertools.count(secrets.randbits(48))

    async def take(self, queue: str, *, most: int, lease_ms: int, look_ahead: int) -> list[Lease]:
        """Up to ``most`` due jobs of ``queue``, leased for ``lease_ms``, with their arq job read
        and their execution claimed by this worker; the wake list then holds one token per job
        still due."""
        keys_, args, prefix = self._call(queue, most, lease_ms, look_ahead)
        sent_at = time.monotonic()
        return self._leases(await self._lease(keys=keys_, args=args), prefix, sent_at)

    async def wait_and_take(self, redis: Redis, queue: str, *, timeout: float, most: int, lease_ms: int,
                            look_ahead: int) -> list[Lease]:
        """Wait up to ``timeout`` s for a token on ``queue``'s wake list, then ``take``, in one
        round trip on a connection of ``redis``'s pool held meanwhile: ``BLPOP`` and LEASE go
        out together, and Redis runs LEASE as soon as ``BLPOP`` returns (a token popped, or the
        timeout: the fallback poll), so the job that woke the worker comes with the wake-up.
        With replicas to wait for, ``WAIT`` follows on the same connection only if LEASE claimed
        something: an idle poll has nothing to protect, and must not wait for absent replicas."""
        keys_, args, prefix = self._call(queue, most, lease_ms, look_ahead)
        pool = redis.connection_pool
        sent_at = time.monotonic()
        conn = await pool.get_connection()
        reply: list[Any] | None = None
        try:
            await conn.send_packed_command(conn.pack_commands([
                ("BLPOP", jobs.wake_list(queue), timeout),
                # EVALSHA itself: a script in a pipeline costs an EXISTS check first.
                ("EVALSHA", self._script.sha, len(keys_), *keys_, *args),
            ]))
            await conn.read_response()  # a token, or none after the timeout: LEASE ran either way
            got: Any = buffered_reply(conn)  # it came with the BLPOP's, as a rule
            if got is NOT_ENOUGH_DATA:
                with contextlib.suppress(NoScriptError):  # a new primary, or a flushed cache: it did not run
                    reply = await conn.read_response()
            elif isinstance(got, Exception):
                if not isinstance(got, NoScriptError):
                    raise got
            else:
                reply = got
            if reply and self._durability is not None:  # it claimed: the claims must reach the replicas
                await conn.send_command("WAIT", self._durability.replicas, self._durability.timeout_ms)
                self._durability.acknowledged(int(await conn.read_response()))
        except BaseException:
            await conn.disconnect()  # a reply may be left unread on it
            raise
        finally:
            await pool.release(conn)
        if reply is None:
            return await self.take(queue, most=most, lease_ms=lease_ms, look_ahead=look_ahead)
        return self._leases(reply, prefix, sent_at)

    def hand_over(self, queue: str, *, lease_ms: int, look_ahead: int, wanted: Callable[[], bool],
                  on_taken: Callable[[list[Lease]], None]) -> Handoff:
        """A LEASE of one due job, to go out right behind the SETTLE of the job a slot just ran
        (``Runtime.handle``'s ``then``), if ``wanted()`` then; ``on_taken`` gets what it took."""
        return Handoff(self, queue, lease_ms, min(look_ahead, HANDOFF_LOOK_AHEAD), wanted, on_taken)

    def _call(self, queue: str, most: int, lease_ms: int, look_ahead: int,
              wake: bool = True) -> tuple[list[str], list[Any], str]:
        """LEASE's keys and arguments, and the prefix of this call's lease tokens (new each call);
        ``wake``: it sets the wake list's tokens right."""
        prefix = f"{self.worker_id}/{next(self._calls):x}/"
        return ([queue, self._hash, jobs.wake_list(queue), self._running],
                [jobs.IN_PROGRESS_KEY_PREFIX, most, lease_ms, look_ahead, prefix, jobs.JOB_KEY_PREFIX,
                 self.worker_id, MAX_ATTEMPTS, "" if wake else "1"],
                prefix)

    @staticmethod
    def _leases(reply: list[Any], prefix: str, sent_at: float) -> list[Lease]:
        leases = []
        for i in range(0, len(reply), 6):
            job_id, score, job, verdict, attempt, waited = reply[i:i + 6]
            job_id = job_id.decode()
            claim = Claim(cast("ClaimVerdict", verdict.decode()), int(attempt), int(waited)) if verdict else None
            leases.append(Lease(job_id, int(float(score)), prefix + job_id, job, max(1, int(attempt)), claim, sent_at))
        return leases

    async def finish(self, queue: str, lease: Lease, *, finished: bool, delay_ms: int | None) -> bool:
        """End ``lease``, retried through an outage; False if it was not ours any more. Not
        finished: the job is due again ``delay_ms`` after its score (at once without one)."""
        job_id = lease.job_id
        keys_ = [jobs.in_progress_key(job_id), jobs.job_key(job_id), jobs.retry_key(job_id), queue, self._hash,
                 jobs.wake_list(queue)]
        args = [job_id, lease.token, "1" if finished else "", lease.score + (delay_ms or 0),
                "1" if delay_ms is None else ""]
        deadline = time.monotonic() + FINISH_RETRY_S
        delay = 0.05
        while True:
            try:
                return bool(await self._finish(keys=keys_, args=args))
            except (RedisError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("cannot finish the lease of job %s yet (%s); retrying", job_id, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)


class Handoff(FollowUp):
    """A LEASE to send with a SETTLE (``Leases.hand_over``), made as it goes out. What it took is
    handed to ``on_taken`` as soon as its reply is read, before anything else runs: from then on
    the worker holds those jobs (its heartbeat reports them)."""

    def __init__(self, leases: Leases, queue: str, lease_ms: int, look_ahead: int,
                 wanted: Callable[[], bool], on_taken: Callable[[list[Lease]], None]) -> None:
        super().__init__()
        self._leases = leases
        self._lease = (queue, 1, lease_ms, look_ahead)
        self._wanted = wanted
        self._on_taken = on_taken
        self._prefix = ""  # of its lease tokens, once made
        self._sent_at = 0.0  # time.monotonic() when it was made, just before it went out
        self._read = False

    def make(self) -> tuple[AsyncScript, list[Any], list[Any]] | None:
        if not self._wanted():
            return None
        keys_, args, self._prefix = self._leases._call(*self._lease, wake=False)
        self._sent_at = time.monotonic()
        return self._leases._script, keys_, args

    def answered(self, reply: asyncio.Future[Any]) -> None:
        """Read the reply once: from its done callback, or earlier by whoever finds it done."""
        if self._read:
            return
        self._read = True
        if reply.cancelled():
            return
        if (exc := reply.exception()) is not None:
            # It may have run: the heartbeat finds a lease and a claim nobody holds, as for any
            # LEASE whose reply was lost, and hands them back.
            log.warning("the LEASE sent with a SETTLE failed (%s); the next job waits for the next look", exc)
            return
        self._on_taken(self._leases._leases(reply.result(), self._prefix, self._sent_at))


@dataclass
class _Running:
    """A lease while arq's run_job runs it (shared by the task that runs it and the job's own)."""

    lease: Lease
    task: asyncio.Task[Any] | None = None  # the task that runs it (set once made)
    began: bool = False  # that task took its first step (a task cancelled before it never does)
    read: bool = False  # run_job's first pipeline was answered from the lease
    ended: bool = False  # the handler's SETTLE ended the lease: finish_job has nothing to do
    handed: bool = False  # its slot of arq's count went to the job its SETTLE leased
    closed: bool = False  # run_job has returned: a job taken now is not run for it


@dataclass
class _RunEnd:
    """When a run of a job in this process ends, and when the run before it here did (None:
    none was going when this one was leased)."""

    done: asyncio.Future[None]
    earlier: asyncio.Future[None] | None


_running: ContextVar[_Running | None] = ContextVar("carmy_running_lease", default=None)


class _AnsweredPipeline:
    """arq's run_job's first pipeline (GET the job, INCR and EXPIRE its retry key), answered
    from what LEASE read. arq counts a job's runs to give up past its ``max_tries``: ours is
    out of the way (attempts are counted, and repeated ones settled, in the execution hash), so
    the count is not kept, and arq is told the attempt LEASE claimed. Anything else arq asks is a
    change of arq: it fails loudly."""

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._replies: list[Any] = []

    async def __aenter__(self) -> _AnsweredPipeline:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None

    def _expect(self, key: str, wanted: str, reply: Any) -> None:
        if key != wanted:
            raise RuntimeError(f"arq's run_job asked for {key!r}: re-check ARQ_PRIVATE_SURFACE")
        self._replies.append(reply)

    def get(self, key: str) -> None:
        self._expect(key, jobs.job_key(self._lease.job_id), self._lease.job or None)

    def incr(self, key: str) -> None:
        self._expect(key, jobs.retry_key(self._lease.job_id), self._lease.runs)

    def expire(self, key: str, seconds: int) -> None:
        self._expect(f"{key} {seconds}", f"{jobs.retry_key(self._lease.job_id)} {_ARQ_RETRY_TTL_S}", True)

    async def execute(self) -> list[Any]:
        return self._replies


class _LeasedPool:
    """The pool as arq's run_job sees it for a leased job: its first pipeline is answered by
    ``_AnsweredPipeline``; everything else is the real pool's."""

    def __init__(self, pool: ArqRedis, running: _Running) -> None:
        self._pool = pool
        self._running = running

    def pipeline(self, transaction: bool = True) -> Any:
        if self._running.read or not transaction:
            return self._pool.pipeline(transaction=transaction)
        self._running.read = True
        return _AnsweredPipeline(self._running.lease)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


class WakeableWorker(Worker):
    """An arq worker that looks for jobs when one is made due (a token on the queue's wake list:
    one job wakes one idle worker) or one of its slots frees up, and every ``poll_delay`` s as a
    fallback; keeps going through Redis outages (arq's own loop exits on the first connection
    error); and tells us when a signal starts its graceful shutdown."""

    _slot_freed: asyncio.Event
    _ends: dict[str, asyncio.Future[None]]  # job id -> the end of its run here (one at a time)
    leases: Leases
    on_drain: Callable[[], None] | None = None
    admit: Admit | None = None  # told of each claim LEASE made, before run_job runs its job
    forget: Callable[[str], None] | None = None  # told of each lease whose run_job has returned

    @property
    def pool(self) -> ArqRedis:
        """arq's pool; inside arq's run_job for a leased job, until its first pipeline, one that
        answers that pipeline from what LEASE read (one round trip less per job)."""
        running = _running.get()
        if running is None or running.read:
            return cast("ArqRedis", self._pool)
        return cast("ArqRedis", _LeasedPool(cast("ArqRedis", self._pool), running))

    async def main(self) -> None:
        self._slot_freed = asyncio.Event()
        self._ends = {}
        if self._pool is None:  # pragma: no cover - we always pass a pool
            raise RuntimeError("WakeableWorker needs redis_pool")
        self.ctx["redis"] = self._pool
        if self.on_startup:
            await self.on_startup(self.ctx)
        backoff = 0.0
        taken: list[Lease] | None = None  # what the last wait's LEASE took (None: take now)
        while True:
            self._slot_freed.clear()
            try:
                leased, taken = taken, None  # run once, even if what follows fails
                if await self._start_due(leased):
                    # The jobs just started take their first steps before this loop's next wait
                    # goes out: a quick job's SETTLE is then written first, and the wait's work
                    # is not on its path (bench/README.md, "Issue 14, one client").
                    for _ in range(START_TURNS):
                        await asyncio.sleep(0)
                if backoff:
                    log.info("queue reachable again")
                backoff = 0.0
                taken = await self._wait_for_work()
            except (RedisError, OSError) as exc:
                if not backoff:
                    log.warning("queue unreachable (%s); retrying", exc)
                backoff = min(backoff * 2 or 0.1, 2.0)
                await asyncio.sleep(backoff)

    async def _wait_for_work(self) -> list[Lease] | None:
        """Until a job may be there to take: a token on the wake list, a slot of a full worker
        freed (at once), or ``poll_delay_s`` (the fallback poll, also for deferred jobs coming
        due). Only a worker with a free slot pops a token, and it leases in the same round
        trip (``Leases.wait_and_take``): what it took, or None when it only waited (a full or
        draining worker, which leaves tokens to others)."""
        if self._slot_freed.is_set():
            return None
        free = self.max_jobs - self.job_counter
        if not (self.allow_pick_jobs and free > 0):
            with contextlib.suppress(TimeoutError):  # not wait_for: it can swallow a cancellation (3.11)
                async with asyncio.timeout(self.poll_delay_s):
                    await self._slot_freed.wait()
            return None
        # A drain that begins meanwhile does not stop this LEASE: what it took is run and drained.
        return await self.leases.wait_and_take(
            cast("ArqRedis", self._pool), self.queue_name or "", timeout=self.poll_delay_s, most=free,
            lease_ms=int(self.in_progress_timeout_s * 1000), look_ahead=self.queue_read_limit)

    def handle_sig_wait_for_completion(self, signum: Signals) -> None:
        if self.allow_pick_jobs and self.on_drain is not None:
            self.on_drain()
        super().handle_sig_wait_for_completion(signum)

    async def _start_due(self, taken: list[Lease] | None) -> int:
        """arq's ``_poll_iteration``, which this replaces: run what the last wait took, or else
        take what is due (one script call), then tidy finished tasks. Returns how many jobs it
        started."""
        free = self.max_jobs - self.job_counter
        leased = taken or []
        if taken is None and self.allow_pick_jobs and free > 0:
            lease_ms = int(self.in_progress_timeout_s * 1000)
            leased = await self.leases.take(self.queue_name or "", most=free, lease_ms=lease_ms,
                                            look_ahead=self.queue_read_limit)
        if leased:
            # Before anything else runs: from now on the heartbeat reports these executions held.
            for lease in leased:
                self._admit(lease)
            for lease in leased:
                await self.sem.acquire()
                self.job_counter += 1
                self._run(lease, self._run_end(lease.job_id))
        for job_id, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[job_id]
                task.result()  # arq's way of surfacing an error of run_job itself
        await self.heart_beat()
        return len(leased)

    def _admit(self, lease: Lease) -> None:
        if lease.claim is None or self.admit is None:
            return
        try:
            payload = deserialize(lease.job)["a"][0]
        except Exception as exc:  # not arq's job: run_job says so; the heartbeat settles the claim
            log.error("job %s cannot be read (%s)", lease.job_id, exc)
            return
        self.admit(payload, lease.claim, lease.token, lease.sent_at)

    def _run_end(self, job_id: str) -> _RunEnd:
        """The end of the run of ``job_id`` about to be started here, and of the one before it."""
        earlier = self._ends.get(job_id)
        end = _RunEnd(self.loop.create_future(), earlier if earlier is not None and not earlier.done() else None)
        self._ends[job_id] = end.done
        return end

    def _run(self, lease: Lease, end: _RunEnd) -> None:
        """Run ``lease``'s job in a task of its own, which holds one slot of arq's count (taken
        by the caller) until it ends, or hands it to the job its SETTLE leased (``_take_over``).

        Listed in ``tasks`` (what the heartbeat reports as leased) from now on; if this process
        still runs an earlier lease of the same job, that run stays listed until it has ended,
        and this one lists itself then."""
        running = _Running(lease)
        task = running.task = self.loop.create_task(self._run_leased(running, end))
        task.add_done_callback(functools.partial(self._run_done, running, end))
        listed = self.tasks.get(lease.job_id)
        if listed is None or listed.done():
            self.tasks[lease.job_id] = task

    async def _run_leased(self, running: _Running, end: _RunEnd) -> None:
        """arq's run_job under ``running.lease``.

        If this process still runs an earlier lease of the same job (it was paused, and the
        janitor gave the job away), that one has lost its execution and is being stopped: this
        one starts once it has ended, so one process never runs one execution twice at once."""
        running.began = True
        lease = running.lease
        try:
            if end.earlier is not None:
                await first_done(end.earlier)
                if self._stopping():  # its claim is let go (forget): the heartbeat hands it back
                    return
                self.tasks[lease.job_id] = cast("asyncio.Task[Any]", running.task)
            _running.set(running)
            await self.run_job(lease.job_id, lease.score)
        except (RedisError, OSError) as exc:  # before the job ran (arq's own reads): give it back
            log.warning("job %s could not start (%s); giving it back", lease.job_id, exc)
            await self.leases.finish(self.queue_name or "", lease, finished=False, delay_ms=None)
        finally:
            running.closed = True
            self._ended(lease, end)
            if self.forget is not None:
                self.forget(lease.token)

    def _run_done(self, running: _Running, end: _RunEnd, task: asyncio.Task[Any]) -> None:
        """A job's task has ended: its slot is free unless it went to the next job; its listing
        goes, unless it failed (the main loop raises arq's error, as arq does); one cancelled
        before its first step (a shutdown) ends here what its own ``finally`` would have."""
        if not running.began:
            running.closed = True
            self._ended(running.lease, end)
            if self.forget is not None:
                self.forget(running.lease.token)
        if not running.handed:
            self._release_sem_dec_counter_on_complete()
        if self.tasks.get(running.lease.job_id) is task and not task.cancelled() and task.exception() is None:
            del self.tasks[running.lease.job_id]
        running.task = None  # the task keeps its context, which holds ``running``: no cycle left

    def _ended(self, lease: Lease, end: _RunEnd) -> None:
        if not end.done.done():
            end.done.set_result(None)
        if self._ends.get(lease.job_id) is end.done:
            del self._ends[lease.job_id]

    def _hand_over(self, running: _Running) -> Handoff:
        """The LEASE that takes the next job of a slot whose job is ending, sent with that job's
        SETTLE: the job starts as soon as the reply is read, without waiting for this loop's
        next look, a round trip later. Only if the worker is full as the SETTLE goes out: one
        with a free slot already waits on the wake list (with LEASE behind its BLPOP), and one
        that drains takes nothing."""
        return self.leases.hand_over(
            self.queue_name or "", lease_ms=int(self.in_progress_timeout_s * 1000), look_ahead=self.queue_read_limit,
            wanted=self._wants_next, on_taken=functools.partial(self._take_over, running=running))

    def _stopping(self) -> bool:
        """Past its drain: arq has cancelled its main task (and every job listed then)."""
        main = self.main_task
        return main is not None and (main.done() or _cancelling(main))

    def _wants_next(self) -> bool:
        return self.allow_pick_jobs and self.job_counter >= self.max_jobs

    def _take_over(self, leases: list[Lease], running: _Running) -> None:
        """Run what a handoff's LEASE took (one job at most) in the slot of ``running``'s job, at
        once: its tool starts while arq's run_job still ends the job before it. Unless that
        job's task has moved on or is stopping (a shutdown cancels it, and arq's run_job
        swallows that): then nobody here holds the job, and the heartbeat hands it back."""
        for lease in leases:
            if running.closed or running.handed or self._stopping() or (
                    running.task is not None and _cancelling(running.task)):
                log.warning("job %s was leased as its slot stopped; the heartbeat hands it back", lease.job_id)
                continue
            end = self._run_end(lease.job_id)
            self._admit(lease)
            running.handed = True
            self._run(lease, end)

    def finish_job(  # type: ignore[override]  # an awaitable, not a coroutine: see below
            self, job_id: str, finish: bool, result_data: bytes | None, result_timeout_s: float | None,
            keep_result_forever: bool, incr_score: int | None, keep_in_progress: float | None) -> Awaitable[object]:
        """arq's, for our leases: results are never kept, a lease taken away finishes as a no-op,
        and one its SETTLE ended (the job is finished and gone) has nothing left to do.

        arq's run_job awaits ``asyncio.shield(self.finish_job(...))``: for nothing to do, a future
        already done, which ``shield`` hands back as it is (a coroutine would be run in a task of
        its own, a few turns of the loop per job)."""
        running = _running.get()
        if running is None or (finish and running.ended):
            done = self.loop.create_future()
            done.set_result(None)
            return done
        return self.leases.finish(self.queue_name or "", running.lease, finished=finish, delay_ms=incr_score)

    async def finish_failed_job(self, job_id: str, result_data: bytes | None) -> None:
        running = _running.get()
        if running is not None:
            await self.leases.finish(self.queue_name or "", running.lease, finished=True, delay_ms=None)

    def _release_sem_dec_counter_on_complete(self) -> None:
        # A worker that was full popped no tokens: jobs may have come due that nobody took
        # (a backlog): look again at once. One with a free slot already waits for tokens.
        was_full = self.job_counter >= self.max_jobs
        super()._release_sem_dec_counter_on_complete()
        if was_full:
            self._slot_freed.set()


def _cancelling(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` is being cancelled, though what it awaited swallowed the cancellation."""
    return task.cancelling() > 0


def build_worker(
    handler: Handler,
    *,
    pool: ArqRedis,
    worker_id: str,
    group: str,
    concurrency: int,
    max_timeout: float,
    drain_seconds: float,
    on_shutdown: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    on_drain: Callable[[], None] | None = None,
    admit: Admit | None = None,
    forget: Callable[[str], None] | None = None,
    durability: Durability | None = None,
) -> WakeableWorker:
    """An arq worker that calls ``handler(payload, lease token, then)`` for each job of ``group``;
    a handler that returns True has ended the lease itself (its SETTLE did), and arq's
    ``finish_job`` then makes no round trip. ``then``, when not None, is the LEASE of the slot's
    next job (a full worker's): the handler sends it right behind the job's SETTLE. Each job's
    execution is claimed with its lease: ``admit(payload, claim, token, sent_at)`` hears of it at
    once, ``forget(token)`` when arq's run_job has returned (whether or not it called the handler).
    ``durability``: the replicas each LEASE waits for (it claims)."""

    async def carmy_execute(ctx: dict[str, Any], payload: bytes) -> None:
        running = _running.get()
        handoff = worker._hand_over(running) if running is not None else None
        try:
            # Attempts are counted in our execution hash, not by arq's job_try.
            ended = await handler(payload, running.lease.token if running else "", handoff)
            if ended and running is not None:
                running.ended = True
        except RedisError as exc:
            # Redis failed us before the outcome was recorded: put the job back (arq would drop
            # a job that raised). Our scripts decide on the next try whether it may run again.
            log.warning("job %s goes back to the queue: %s", ctx.get("job_id"), exc)
            raise Retry(defer=1) from exc
        if handoff is not None and handoff.reply is not None:
            # Its reply follows SETTLE's on the same connection: here already, or about to be;
            # read before this job's run ends, so that the next job gets its slot.
            if not handoff.reply.done():
                await first_done(handoff.reply)
            handoff.answered(handoff.reply)  # unless its done callback did already

    worker = WakeableWorker(
        functions=[func(carmy_execute, name=jobs.FUNCTION, max_tries=_ARQ_MAX_TRIES,
                        # Our runtime enforces each tool's timeout; arq's only backs it up.
                        timeout=max_timeout + 15)],
        redis_pool=pool,
        queue_name=jobs.queue_name(group),
        max_jobs=concurrency,
        keep_result=0,  # results are our records, not arq's
        job_serializer=serialize,
        job_deserializer=deserialize,
        job_completion_wait=int(drain_seconds) + 1,
        on_shutdown=cast("StartupShutdown | None", on_shutdown),
        log_results=False,
        health_check_interval=3600,
    )
    worker.on_drain = on_drain
    worker.admit, worker.forget = admit, forget
    worker.leases = Leases(pool, worker_id, durability=durability)
    return worker


def connect(redis: RedisConnector | str, **options: Any) -> ArqRedis:
    """A redis-py client for ``CARMY_REDIS_URL`` that arq's worker accepts as its pool."""
    connector = redis if isinstance(redis, RedisConnector) else RedisConnector(redis)
    return ArqRedis(connection_pool=connector.pool(socket_connect_timeout=1.0, **options))
