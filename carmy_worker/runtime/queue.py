"""The one module that knows arq.

arq gives us the queue layout, job leasing (its in-progress keys), retries after a crash and
graceful shutdown. Everything else (records, events, fencing) is ours, so replacing arq later
means rewriting this file only. Three things differ from arq's defaults:

* jobs are msgpack (msgspec), never pickle;
* the API writes jobs itself, inside the same Lua script that reserves idempotency and
  admission (one round trip), in exactly the layout ``ArqRedis.enqueue_job`` would write
  (``carmy_worker.store.jobs``, which does not import arq);
* workers wait on a pub/sub wake-up channel instead of sleeping 0.5 s between polls, so a job
  starts within milliseconds on an idle worker, and take due jobs with one Lua call (LEASE)
  instead of arq's four round trips per job. The 0.5 s poll stays as a fallback.

That last part overrides arq internals. ``ARQ_PRIVATE_SURFACE`` names every private or
undocumented name of arq this module relies on; ``tests/carmy_worker/runtime/test_arq_surface.py``
fails loudly when an arq release changes one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from signal import Signals
from typing import TYPE_CHECKING, Any, cast

import msgspec
from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix, job_key_prefix
from arq.worker import Retry, Worker, func
from redis.exceptions import RedisError

from carmy_worker.store import jobs
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
    ),
    "arq.worker.Worker methods called": ("run_job", "heart_beat"),
    "arq.worker.Worker attributes": (
        "_pool", "pool", "ctx", "on_startup", "allow_pick_jobs", "max_jobs", "job_counter", "sem", "tasks",
        "loop", "queue_name", "in_progress_timeout_s", "queue_read_limit", "poll_delay_s",
    ),
    # The job layout store.jobs writes without arq: key prefixes, and the job dict's fields.
    "arq.constants": ("job_key_prefix", "in_progress_key_prefix"),
    "arq.jobs.deserialize_job_raw fields": ("t", "f", "a", "k", "et"),
}

if (job_key_prefix, in_progress_key_prefix) != (jobs.JOB_KEY_PREFIX, jobs.IN_PROGRESS_KEY_PREFIX):
    raise ImportError("this arq writes jobs under other keys than carmy_worker.store.jobs: pin arq==0.28.*")

_encoder = msgspec.msgpack.Encoder(enc_hook=repr)  # arq may hand us exceptions to store
_decoder = msgspec.msgpack.Decoder()


def serialize(obj: dict[str, Any]) -> bytes:
    return _encoder.encode(obj)


def deserialize(data: bytes) -> dict[str, Any]:
    return _decoder.decode(data)  # type: ignore[no-any-return]


Handler = Callable[[bytes], Awaitable[None]]

# Takes up to ARGV[2] jobs in one round trip: the due ones at the head of the queue (by Redis's
# clock, like the scores SUBMIT writes) that no other worker has leased. arq polls with the
# worker's clock, then takes each job with WATCH/EXISTS/ZSCORE/MULTI/EXEC (four round trips
# each); the in-progress keys set here are exactly arq's. Returns {id, score, id, score, ...}.
# KEYS: queue; ARGV: in-progress key prefix, how many, lease ms, how far down the queue to look
LEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[4]))
local leased, want = {}, tonumber(ARGV[2]) * 2
for i = 1, #due, 2 do
  if #leased >= want then break end
  if redis.call('SET', ARGV[1] .. due[i], '1', 'NX', 'PX', ARGV[3]) then
    table.insert(leased, due[i])
    table.insert(leased, due[i + 1])
  end
end
return leased
"""


class Lease:
    """LEASE on one client."""

    def __init__(self, redis: ArqRedis) -> None:
        self._script = redis.register_script(LEASE)

    async def __call__(self, queue: str, *, most: int, lease_ms: int, look_ahead: int) -> list[tuple[str, int]]:
        """Up to ``most`` due jobs of ``queue`` leased for ``lease_ms``: (job id, score) each."""
        reply = await self._script(keys=[queue], args=[jobs.IN_PROGRESS_KEY_PREFIX, most, lease_ms, look_ahead])
        return [(reply[i].decode(), int(float(reply[i + 1]))) for i in range(0, len(reply), 2)]


class WakeableWorker(Worker):
    """An arq worker that polls when told to (and every ``poll_delay`` s as a fallback), keeps
    going through Redis outages (arq's own loop exits on the first connection error), and
    tells us when a signal starts its graceful shutdown."""

    _wake: asyncio.Event
    _lease: Lease
    on_drain: Callable[[], None] | None = None

    async def main(self) -> None:
        self._wake = asyncio.Event()
        if self._pool is None:  # pragma: no cover - we always pass a pool
            raise RuntimeError("WakeableWorker needs redis_pool")
        self.ctx["redis"] = self.pool
        self._lease = Lease(self.pool)
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
            leased = await self._lease(self.queue_name or "", most=free, lease_ms=lease_ms,
                                       look_ahead=self.queue_read_limit)
            for job_id, score in leased:
                await self.sem.acquire()
                self.job_counter += 1
                task = self.loop.create_task(self.run_job(job_id, score))
                task.add_done_callback(lambda _: self._release_sem_dec_counter_on_complete())
                self.tasks[job_id] = task
        for job_id, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[job_id]
                task.result()  # arq's way of surfacing an error of run_job itself
        await self.heart_beat()

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
    group: str,
    concurrency: int,
    max_timeout: float,
    drain_seconds: float,
    on_shutdown: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    on_drain: Callable[[], None] | None = None,
) -> WakeableWorker:
    """An arq worker that calls ``handler(payload)`` for each job of ``group``."""

    async def carmy_execute(ctx: dict[str, Any], payload: bytes) -> None:
        try:
            await handler(payload)  # attempts are counted in our execution hash, not by arq's job_try
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
    return worker


def connect(redis: RedisConnector | str, **options: Any) -> ArqRedis:
    """A redis-py client for ``CARMY_REDIS_URL`` that arq's worker accepts as its pool."""
    connector = redis if isinstance(redis, RedisConnector) else RedisConnector(redis)
    return ArqRedis(connection_pool=connector.pool(socket_connect_timeout=1.0, **options))
