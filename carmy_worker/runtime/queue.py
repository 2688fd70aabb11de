"""The one module that knows arq.

arq gives us the queue layout, its job runner (``run_job``: timeout, Retry, cancellation) and
graceful shutdown. Everything else (records, events, fencing) is ours, so replacing arq later
means rewriting this file only. Four things differ from arq's defaults:

* jobs are msgpack (msgspec), never pickle;
* the API writes jobs itself, inside the same Lua script that reserves idempotency and
  admission (one round trip), in exactly the layout ``ArqRedis.enqueue_job`` would write
  (``carmy_worker.store.jobs``, which does not import arq);
* workers wait on a pub/sub wake-up channel instead of sleeping 0.5 s between polls, so a job
  starts within milliseconds on an idle worker, and take due jobs with one Lua call (LEASE)
  instead of arq's four round trips per job. The 0.5 s poll stays as a fallback;
* each lease holds a token (in arq's in-progress key and the worker's leases hash), and FINISH
  replaces arq's ``finish_job``: it ends only its own lease, so a worker that lost a job while
  paused cannot delete it, and the janitor can hand back the leases of a dead worker.

The last two override arq internals. ``ARQ_PRIVATE_SURFACE`` names every private or
undocumented name of arq this module relies on; ``tests/carmy_worker/runtime/test_arq_surface.py``
fails loudly when an arq release changes one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from signal import Signals
from typing import TYPE_CHECKING, Any, cast

import msgspec
from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix
from arq.worker import Retry, Worker, func
from msgspec import Struct
from redis.exceptions import RedisError

from carmy_worker.store import jobs, keys
from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.pubsub import listen_forever

if TYPE_CHECKING:
    from arq.typing import StartupShutdown

log = logging.getLogger("carmy.queue")

# arq retries jobs itself; we count attempts in our own execution hash and settle repeated
# interruptions there, so arq's own limit only has to be out of the way.
_ARQ_MAX_TRIES = 1000

# What WakeableWorker uses of arq beyond its documented API (Worker(...), async_run, close,
# func, Retry, ArqRedis): attributes it reads or writes and methods it overrides or calls.
ARQ_PRIVATE_SURFACE: dict[str, tuple[str, ...]] = {
    "arq.worker.Worker methods overridden": (
        "main", "handle_sig_wait_for_completion", "_poll_iteration", "_release_sem_dec_counter_on_complete",
        "finish_job", "finish_failed_job",
    ),
    "arq.worker.Worker methods called": ("run_job", "heart_beat"),
    "arq.worker.Worker attributes": (
        "_pool", "pool", "ctx", "on_startup", "allow_pick_jobs", "max_jobs", "job_counter", "sem", "tasks",
        "loop", "queue_name", "in_progress_timeout_s", "queue_read_limit", "poll_delay_s",
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


Handler = Callable[[bytes, str], Awaitable[None]]  # (job payload, lease token)

# Takes up to ARGV[2] jobs in one round trip: the due ones at the head of the queue (by Redis's
# clock, like the scores SUBMIT writes) that no other worker has leased. arq polls with the
# worker's clock, then takes each job with WATCH/EXISTS/ZSCORE/MULTI/EXEC (four round trips
# each). The in-progress keys set here are arq's, holding a token unique to this lease, also
# listed in the worker's leases hash: the janitor puts back the jobs of a dead worker that
# never claimed them, and a late finish of a lease that was taken away touches nothing.
# Returns {id, score, id, score, ...}.
# KEYS: queue, leases hash; ARGV: in-progress key prefix, how many, lease ms, how far down the
# queue to look, token prefix
LEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[4]))
local leased, want = {}, tonumber(ARGV[2]) * 2
for i = 1, #due, 2 do
  if #leased >= want then break end
  local token = ARGV[5] .. due[i]
  if redis.call('SET', ARGV[1] .. due[i], token, 'NX', 'PX', ARGV[3]) then
    redis.call('HSET', KEYS[2], due[i], token)
    table.insert(leased, due[i])
    table.insert(leased, due[i + 1])
  end
end
return leased
"""

# arq's finish_job and finish_failed_job, for one lease: only while the in-progress key still
# holds this lease's token. Finished: the job is gone; otherwise (a retry, a shutdown) it stays
# queued, ARGV[4] ms later if given. A lease the janitor took away finishes as a no-op, so a
# paused worker waking up late cannot delete the job another worker now runs.
# KEYS: in-progress, job, retry, queue, leases hash; ARGV: job id, token, finished ('1' or ''), delay ms or ''
FINISH = """
if redis.call('HGET', KEYS[5], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[5], ARGV[1]) end
if redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[3] == '1' then
  redis.call('DEL', KEYS[2], KEYS[3])
  redis.call('ZREM', KEYS[4], ARGV[1])
elseif ARGV[4] ~= '' then
  redis.call('ZINCRBY', KEYS[4], tonumber(ARGV[4]), ARGV[1])
end
return 1
"""

# Finishing a lease is retried through a Redis outage this long: a lease left behind would hold
# its job back until the in-progress key expires (the longest tool timeout and then some).
FINISH_RETRY_S = 60.0


class Lease(Struct, frozen=True):
    job_id: str
    score: int
    token: str


class Leases:
    """LEASE and FINISH for one worker's jobs, on one client."""

    def __init__(self, redis: ArqRedis, worker_id: str) -> None:
        self._lease = redis.register_script(LEASE)
        self._finish = redis.register_script(FINISH)
        self.worker_id = worker_id
        self._hash = keys.leases(worker_id)

    async def take(self, queue: str, *, most: int, lease_ms: int, look_ahead: int) -> list[Lease]:
        """Up to ``most`` due jobs of ``queue``, leased for ``lease_ms``."""
        prefix = f"{self.worker_id}/{secrets.token_hex(4)}/"
        reply = await self._lease(keys=[queue, self._hash],
                                  args=[jobs.IN_PROGRESS_KEY_PREFIX, most, lease_ms, look_ahead, prefix])
        ids = [job_id.decode() for job_id in reply[::2]]
        return [Lease(job_id, int(float(score)), prefix + job_id)
                for job_id, score in zip(ids, reply[1::2], strict=True)]

    async def finish(self, queue: str, job_id: str, token: str, *, finished: bool, delay_ms: int | None) -> bool:
        """End the lease ``token`` on ``job_id``, retried through an outage; False if it was not ours any more."""
        keys_ = [jobs.in_progress_key(job_id), jobs.job_key(job_id), jobs.retry_key(job_id), queue, self._hash]
        args = [job_id, token, "1" if finished else "", "" if delay_ms is None else delay_ms]
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


# The lease a job runs under, for the finish_job that arq's run_job calls at its end.
_lease_token: ContextVar[str] = ContextVar("carmy_lease_token", default="")


class WakeableWorker(Worker):
    """An arq worker that polls when told to (and every ``poll_delay`` s as a fallback), keeps
    going through Redis outages (arq's own loop exits on the first connection error), and
    tells us when a signal starts its graceful shutdown."""

    _wake: asyncio.Event
    leases: Leases
    on_drain: Callable[[], None] | None = None

    async def main(self) -> None:
        self._wake = asyncio.Event()
        if self._pool is None:  # pragma: no cover - we always pass a pool
            raise RuntimeError("WakeableWorker needs redis_pool")
        self.ctx["redis"] = self.pool
        if self.on_startup:
            await self.on_startup(self.ctx)
        listener = asyncio.create_task(self._listen())
        backoff = 0.0
        try:
            while True:
                self._wake.clear()
                try:
                    await self._poll_iteration()
                    if backoff:
                        log.info("queue reachable again")
                    backoff = 0.0
                except (RedisError, OSError) as exc:
                    if not backoff:
                        log.warning("queue unreachable (%s); retrying", exc)
                    backoff = min(backoff * 2 or 0.1, 2.0)
                    await asyncio.sleep(backoff)
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_delay_s)
        finally:
            listener.cancel()

    def handle_sig_wait_for_completion(self, signum: Signals) -> None:
        if self.allow_pick_jobs and self.on_drain is not None:
            self.on_drain()
        super().handle_sig_wait_for_completion(signum)

    async def _poll_iteration(self) -> None:
        """Take what is due (one script call), then tidy finished tasks, as arq's does."""
        free = self.max_jobs - self.job_counter
        if self.allow_pick_jobs and free > 0:
            lease_ms = int(self.in_progress_timeout_s * 1000)
            for lease in await self.leases.take(self.queue_name or "", most=free, lease_ms=lease_ms,
                                                look_ahead=self.queue_read_limit):
                await self.sem.acquire()
                self.job_counter += 1
                task = self.loop.create_task(self._run_leased(lease, self.tasks.get(lease.job_id)))
                task.add_done_callback(lambda _: self._release_sem_dec_counter_on_complete())
                self.tasks[lease.job_id] = task
        for job_id, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[job_id]
                task.result()  # arq's way of surfacing an error of run_job itself
        await self.heart_beat()

    async def _run_leased(self, lease: Lease, earlier: asyncio.Task[None] | None) -> None:
        """arq's run_job under ``lease``. If this process still runs an earlier lease of the same
        job (it was paused, and the janitor gave the job away), that one has lost its execution
        and is being stopped: this one starts once it has ended, so one process never runs one
        execution twice at once."""
        if earlier is not None and not earlier.done():
            await asyncio.wait([earlier])
        _lease_token.set(lease.token)
        try:
            await self.run_job(lease.job_id, lease.score)
        except (RedisError, OSError) as exc:  # before the job ran (arq's own reads): give it back
            log.warning("job %s could not start (%s); giving it back", lease.job_id, exc)
            await self.leases.finish(self.queue_name or "", lease.job_id, lease.token, finished=False, delay_ms=None)

    async def finish_job(self, job_id: str, finish: bool, result_data: bytes | None, result_timeout_s: float | None,
                         keep_result_forever: bool, incr_score: int | None, keep_in_progress: float | None) -> None:
        """arq's, for our leases: results are never kept, and a lease taken away finishes as a no-op."""
        await self.leases.finish(self.queue_name or "", job_id, _lease_token.get(), finished=finish,
                                 delay_ms=incr_score)

    async def finish_failed_job(self, job_id: str, result_data: bytes | None) -> None:
        await self.leases.finish(self.queue_name or "", job_id, _lease_token.get(), finished=True, delay_ms=None)

    def _release_sem_dec_counter_on_complete(self) -> None:
        super()._release_sem_dec_counter_on_complete()
        self._wake.set()  # a slot is free: more may be waiting

    async def _listen(self) -> None:
        def wake(*_: object) -> None:
            self._wake.set()

        # On every (re)connection too: anything queued while we were not listening.
        await listen_forever(self.pool, lambda: [jobs.wake_channel(self.queue_name or "")], wake,
                             name="wake-up channel", on_connect=wake, max_backoff=0.5)


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
) -> WakeableWorker:
    """An arq worker that calls ``handler(payload, lease token)`` for each job of ``group``."""

    async def carmy_execute(ctx: dict[str, Any], payload: bytes) -> None:
        try:
            # Attempts are counted in our execution hash, not by arq's job_try.
            await handler(payload, _lease_token.get())
        except RedisError as exc:
            # Redis failed us before the outcome was recorded: put the job back (arq would drop
            # a job that raised). Our scripts decide on the next try whether it may run again.
            log.warning("job %s goes back to the queue: %s", ctx.get("job_id"), exc)
            raise Retry(defer=1) from exc

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
    worker.leases = Leases(pool, worker_id)
    return worker


def connect(redis: RedisConnector | str, **options: Any) -> ArqRedis:
    """A redis-py client for ``CARMY_REDIS_URL`` that arq's worker accepts as its pool."""
    connector = redis if isinstance(redis, RedisConnector) else RedisConnector(redis)
    return ArqRedis(connection_pool=connector.pool(socket_connect_timeout=1.0, **options))
