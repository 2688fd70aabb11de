"""The arq adapter: the one module that knows arq's objects.

arq gives us its job runner (``run_job``: timeout, Retry, cancellation), its worker's slots and
graceful shutdown. Everything else is ours and lives in the store: the queue's layout, written
without arq (``store.jobs``), and the leases on it (``store.leases``: LEASE, FINISH, the LEASE a
SETTLE carries); records, events and fencing (``store.attempts``, ``store.verdicts``). This
module is what stands between them: ``WakeableWorker`` finds work our way and hands each lease
to arq's ``run_job``, and ``build_worker`` and ``connect`` make it. Replacing arq means
rewriting this module, and ``store.jobs`` only if the key layout changes. Four things differ
from arq's defaults:

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
  (``store.leases``) replaces arq's ``finish_job``: it ends only its own lease, so a worker that lost a job while
  paused cannot delete it, and the janitor can hand back the leases of a dead worker. A job
  settled with its record ends its lease in the same script (SETTLE, ``store.attempts``), so
  ``finish_job`` then has nothing left to do: a job costs an idle worker two round trips
  (``BLPOP`` with LEASE, then SETTLE), and a full one with jobs waiting one: the SETTLE of a
  slot's job carries the LEASE of its next (``Leases.hand_over``), which starts as soon as the
  reply is read, in a task of its own that takes over the slot of arq's count
  (``WakeableWorker._take_over``), while arq's run_job still ends the job before it.

**Over several partitions** (``CARMY_REDIS_PARTITIONS``) a group has a queue in each, and a
worker serves them all: an idle one waits on every wake list at once (``store.wakeups``: each
partition leases only its share of the free slots), unless a LEASE reply showed work due
somewhere (``store.hints``): then one LEASE takes it there. A freed slot's LEASE, like the one a
SETTLE carries, goes to the next partition in turn (round robin, after the last one served) not
known to be empty, and none goes out when all are. arq's own
``queue_name`` is partition 0's queue: arq names only its status line after it.

**On a Redis Cluster** (issue 34) arq's pool, which is not cluster-aware, never reaches a job's
keys: arq asks for them by its own names (``arq:job:<id>``, ``arq:retry:<id>``) only in run_job's
first pipeline, which is answered from the lease here, while the store keeps them under the
execution's hash tag (``carmy:{c:N}:arq:job:<id>``), in the slot of the scripts that write and
lease them; every other command of the seam is a store script (LEASE, FINISH, SETTLE) or the
BLPOP on a wake list, whose keys are all in the queue's slot, so that each can go to that slot's
primary (the connection held for BLPOP-then-LEASE is one of that primary's:
``store.cluster.held_connection``). What arq itself still sends is its status line (``heart_beat``: one SET of
``<queue>:health-check``, in the queue's slot).

The last two override arq internals. ``ARQ_PRIVATE_SURFACE`` names every private or
undocumented name of arq this module relies on; ``tests/carmy_worker/runtime/test_arq_surface.py``
fails loudly when an arq release changes one of them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from signal import Signals
from typing import TYPE_CHECKING, Any, cast

import msgspec
from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix, job_key_prefix, retry_key_prefix
from arq.worker import Retry, Worker, func
from redis.exceptions import RedisError

from carmy_worker.loop import Signal, first_done, running_loop
from carmy_worker.store import jobs, keys
from carmy_worker.store.attempts import Claim
from carmy_worker.store.batch import FollowUp
from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.durable import Durability
from carmy_worker.store.leases import Handoff, Lease, Leases
from carmy_worker.store.pubsub import raise_if_cancelled, stop_if_cancelled
from carmy_worker.store.wakeups import wait_on_every_partition

if TYPE_CHECKING:
    from arq.typing import StartupShutdown

log = logging.getLogger("carmy.queue")

# arq retries jobs itself; we count attempts in our own execution hash and settle repeated
# interruptions there, so arq's own limit only has to be out of the way.
_ARQ_MAX_TRIES = 1000

# How much longer than the longest tool timeout arq's timeout of a job is: it only backs up the
# runtime's own (a handler stuck past it, say on Redis, is cancelled and the job failed, as arq does).
ARQ_TIMEOUT_MARGIN_S = 15

# How long arq's run_job keeps its count of a job's runs (its pipeline's EXPIRE, answered from
# the lease: the count is not kept, see _AnsweredPipeline).
_ARQ_RETRY_TTL_S = 88400

# What WakeableWorker uses of arq beyond its documented API (Worker(...), async_run, close,
# func, Retry, ArqRedis): attributes it reads or writes and methods it overrides or calls.
ARQ_PRIVATE_SURFACE: dict[str, tuple[str, ...]] = {
    "arq.worker.Worker methods overridden": (
        "main", "handle_sig_wait_for_completion", "_sleep_until_tasks_complete", "_release_sem_dec_counter_on_complete",
        "finish_job", "finish_failed_job",
    ),
    "arq.worker.Worker methods called": ("run_job", "heart_beat"),
    "arq.worker.Worker attributes": (
        "_pool", "pool", "ctx", "on_startup", "allow_pick_jobs", "max_jobs", "job_counter", "sem", "tasks",
        "loop", "queue_name", "in_progress_timeout_s", "queue_read_limit", "poll_delay_s", "allow_abort_jobs",
        "main_task", "job_timeout_s",
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
        # Its timeout: none when neither the function nor the worker has one, and wait_for then
        # awaits the job's task as it is (the backstop is the job's own: _Backstop).
        "timeout_s = self.job_timeout_s if function.timeout_s is None else function.timeout_s",
        "result = await asyncio.wait_for(task, timeout_s)",
    ),
    # The job layout store.jobs writes without arq: key prefixes, and the job dict's fields.
    "arq.constants": ("job_key_prefix", "in_progress_key_prefix", "retry_key_prefix"),
    "arq.jobs.deserialize_job_raw fields": ("t", "f", "a", "k", "et"),
}

if (job_key_prefix, in_progress_key_prefix, retry_key_prefix) != (
        jobs.ARQ_JOB_KEY_PREFIX, jobs.ARQ_IN_PROGRESS_KEY_PREFIX, jobs.ARQ_RETRY_KEY_PREFIX):
    raise ImportError("this arq names its jobs' keys otherwise than carmy_worker.store.jobs: pin arq==0.28.*")

_encoder = msgspec.msgpack.Encoder(enc_hook=repr)  # arq may hand us exceptions to store
_decoder = msgspec.msgpack.Decoder()


def serialize(obj: dict[str, Any]) -> bytes:
    return _encoder.encode(obj)


class Payload(bytes):
    """A job's payload as arq's ``run_job`` gets it: bytes whose ``repr`` is short. ``run_job``
    builds a log line of ``repr(args)`` (cut to 80 characters only afterwards) for every job,
    whether or not anything logs it: of a 1 MiB payload, that was a fifth of the worker's CPU
    (bench/README.md, "Cost curves")."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<payload of {len(self)} bytes>"


def deserialize(data: bytes) -> dict[str, Any]:
    """A job as arq reads it; for the job of a lease this worker runs, the one its admission
    read already (run_job hands back the bytes it was given: ``_AnsweredPipeline``)."""
    running = _running.get()
    if running is not None and running.job is not None and data is running.lease.job:
        job, running.job = running.job, None
        return job
    return _decode(data)


def _decode(data: bytes) -> dict[str, Any]:
    job: dict[str, Any] = _decoder.decode(data)
    args = job.get("a")
    if isinstance(args, list) and args and type(args[0]) is bytes:
        args[0] = Payload(args[0])
    return job


# (job payload, lease token, the LEASE to send right behind its SETTLE or None) -> whether its
# SETTLE also ended the lease (then nothing is left to finish)
Handler = Callable[[bytes, str, FollowUp | None], Awaitable[bool | None]]
# (job payload, the claim LEASE made, lease token, when LEASE was sent: time.monotonic()), called
# as soon as LEASE answers, before arq's run_job gets to the job: the worker holds the execution
# from then on.
Admit = Callable[[bytes, Claim, str, float], None]

# Turns of the event loop the jobs a worker just started get before it waits for more: enough
# for arq's run_job, its task for the job, the tool's task (which wakes the job's as it ends:
# invoke) and the batch that writes SETTLE, and one to spare. Each turn more is a turn of the
# loop for nothing (an epoll_wait) once a quick job's SETTLE is out.
START_TURNS = 5


@dataclass
class _Running:
    """A lease while arq's run_job runs it (shared by the task that runs it and the job's own)."""

    lease: Lease
    job: dict[str, Any] | None = None  # its arq job, as admitting the lease read it, until run_job reads it
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
        self._expect(key, jobs.ARQ_JOB_KEY_PREFIX + self._lease.job_id, self._lease.job or None)

    def incr(self, key: str) -> None:
        self._expect(key, jobs.ARQ_RETRY_KEY_PREFIX + self._lease.job_id, self._lease.runs)

    def expire(self, key: str, seconds: int) -> None:
        self._expect(f"{key} {seconds}", f"{jobs.ARQ_RETRY_KEY_PREFIX}{self._lease.job_id} {_ARQ_RETRY_TTL_S}", True)

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

    _slot_freed: Signal
    _ends: dict[str, asyncio.Future[None]]  # job id -> the end of its run here (one at a time)
    # Jobs whose task ended in an error or a cancellation, still listed in ``tasks``: the main loop
    # surfaces their error as arq does. Tasks that end well unlist themselves (``_run_done``), so
    # the loop looks at these only, not at every running task each time it starts a job.
    _failed: list[str]
    leases: Leases
    # The group's queue in each partition (by partition), and whose turn it is: the partition after
    # the one whose job started last (``_served``), so that the next LEASE of a freed slot or of a
    # SETTLE, and a wait's first share of claims, go there (round robin, whatever mechanism took
    # the last job: a counter moved by each LEASE alone could keep landing on the same partition).
    queues: list[str]
    _turn: int = 0
    # A LEASE is under way, or what it took is not yet started: from before the wait (or the
    # take) that sends it until ``_start_due`` has listed its jobs in ``tasks``.
    _taking: bool = False
    _asked: bool = False  # the loop's last wait for work went to Redis (and so was answered, if it returned)
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
        self._slot_freed = Signal()
        self._ends = {}
        self._failed = []
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
                    # (arq's heartbeat too) is not on its path (bench/README.md, "Issue 14, one client").
                    for _ in range(START_TURNS):
                        await asyncio.sleep(0)
                # A cancellation a call swallowed (Python 3.11's races, redis-py's timeouts) still
                # stops the loop: it went on waiting for work, and arq's stop waited on it for ever.
                stop_if_cancelled()
                await self.heart_beat()
                self._asked = False
                taken = await self._wait_for_work()
                # Reachable again only once Redis answered: a full or draining worker's wait, and
                # a freed slot's turn, send nothing, and with several partitions neither may the
                # LEASE before it (none known to have work), so reaching here proves nothing.
                if self._asked:
                    if backoff:
                        log.info("queue reachable again")
                    backoff = 0.0
            except (RedisError, OSError) as exc:
                raise_if_cancelled(exc)  # a cancellation redis-py turned into its error
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
            # Not asyncio.timeout (nor wait_for, which can swallow a cancellation in 3.11): its
            # expiry cancels this task, arq's main, until the wait has ended, and a handoff's reply
            # read in between took that for a shutdown (``_stopping``), leaving the job it leased
            # to the heartbeat, seconds later.
            await first_done(timeout=self.poll_delay_s, signal=self._slot_freed)
            return None
        # A drain that begins meanwhile does not stop this LEASE: what it took is run and drained
        # (``_taking``: the drain waits for it).
        self._taking = self._asked = True
        pool, lease_ms = cast("ArqRedis", self._pool), int(self.in_progress_timeout_s * 1000)
        if len(self.queues) == 1:
            return await self.leases.wait_and_take(pool, self.queues[0], timeout=self.poll_delay_s, most=free,
                                                   lease_ms=lease_ms, look_ahead=self.queue_read_limit)
        known = self.leases.hints.with_work(self.queues, self._turn, self.leases.answering)
        if known is not None:  # work seen due (a round's LEASE that claimed less than it found): take it
            self._turn = (known + 1) % len(self.queues)
            taken = await self.leases.take(self.queues[known], most=free, lease_ms=lease_ms,
                                           look_ahead=self.queue_read_limit)
            if not taken:  # gone, or held by leases its count saw as due: not known any more
                self.leases.hints.seen(self.queues[known], 0)
            return taken
        turn = self._next_turn()
        return await wait_on_every_partition(
            self.leases, pool, self.queues[turn:] + self.queues[:turn], timeout=self.poll_delay_s, free=free,
            lease_ms=lease_ms, look_ahead=self.queue_read_limit)

    def _next_turn(self) -> int:
        """The partition whose turn it is (an index in ``queues``), and the turn moved on."""
        turn = self._turn
        self._turn = (turn + 1) % len(self.queues)
        return turn

    def _next_with_work(self) -> int | None:
        """The partition a freed slot's LEASE goes to: the next in turn not known to be empty
        (``DueHints.maybe_work``) whose last LEASE was answered (``Leases.answering``: a hung
        primary's would hold this loop up to ``TAKE_TIMEOUT_S``), the turn moved past it; None
        when there is none (the slot then waits on every partition). With one partition, always it."""
        if len(self.queues) == 1:
            return 0
        index = self.leases.hints.maybe_work(self.queues, self._turn, self.leases.answering)
        if index is not None:
            self._turn = (index + 1) % len(self.queues)
        return index

    def _served(self, lease: Lease) -> None:
        """``lease``'s job starts here: the next LEASE looks first in the partition after its."""
        if len(self.queues) > 1 and lease.queue in self.queues:
            self._turn = (self.queues.index(lease.queue) + 1) % len(self.queues)

    def handle_sig_wait_for_completion(self, signum: Signals) -> None:
        if self.allow_pick_jobs and self.on_drain is not None:
            self.on_drain()
        super().handle_sig_wait_for_completion(signum)

    async def _sleep_until_tasks_complete(self) -> None:
        """arq's drain waits while jobs run, then cancels what still runs and the main loop. It
        also waits here for a LEASE under way (``_taking``): the jobs it claims are this worker's
        to run and drain. arq's, seeing no task yet, ended at once, and the jobs started as it
        cancelled them: a non-idempotent tool marked begun and never run, ``EXECUTION_UNCERTAIN``
        on a graceful stop (found by ``bin/chaos --cluster``'s ``worker-term``). A wait for work
        ends within ``poll_delay_s``."""
        while self.tasks or (self._taking and not self._stopping()):
            await asyncio.sleep(0.1)

    async def _start_due(self, taken: list[Lease] | None) -> int:
        """arq's ``_poll_iteration``, which this replaces (but for its ``heart_beat``, which the
        loop sends after the jobs started took their first steps): run what the last wait took,
        or else take what is due (one script call), then tidy finished tasks. Returns how many
        jobs it started."""
        free = self.max_jobs - self.job_counter
        leased = taken or []
        if taken is None and self.allow_pick_jobs and free > 0 and (index := self._next_with_work()) is not None:
            lease_ms = int(self.in_progress_timeout_s * 1000)
            self._taking = True
            leased = await self.leases.take(self.queues[index], most=free, lease_ms=lease_ms,
                                            look_ahead=self.queue_read_limit)
        self._taking = False  # what it took is listed in ``tasks`` below, before the next turn
        if leased:
            # Before anything else runs: from now on the heartbeat reports these executions held.
            read = [self._admit(lease) for lease in leased]
            for lease, job in zip(leased, read, strict=True):
                await self.sem.acquire()
                self.job_counter += 1
                self._run(lease, self._run_end(lease.job_id), job)
        failed, self._failed = self._failed, []
        for job_id in failed:
            task = self.tasks.get(job_id)
            if task is not None and task.done():
                del self.tasks[job_id]
                task.result()  # arq's way of surfacing an error of run_job itself
        return len(leased)

    def _admit(self, lease: Lease) -> dict[str, Any] | None:
        """Tell ``admit`` of the claim ``lease`` made; its arq job, read (None: unreadable)."""
        if lease.claim is None:
            return None
        try:
            job = _decode(lease.job)
            payload = job["a"][0]
        except Exception as exc:  # not arq's job: run_job says so; the heartbeat settles the claim
            log.error("job %s cannot be read (%s)", lease.job_id, exc)
            return None
        if self.admit is not None:
            self.admit(payload, lease.claim, lease.token, lease.sent_at)
        return job

    def _run_end(self, job_id: str) -> _RunEnd:
        """The end of the run of ``job_id`` about to be started here, and of the one before it."""
        earlier = self._ends.get(job_id)
        end = _RunEnd(self.loop.create_future(), earlier if earlier is not None and not earlier.done() else None)
        self._ends[job_id] = end.done
        return end

    def _run(self, lease: Lease, end: _RunEnd, job: dict[str, Any] | None) -> None:
        """Run ``lease``'s job in a task of its own, which holds one slot of arq's count (taken
        by the caller) until it ends, or hands it to the job its SETTLE leased (``_take_over``).

        Listed in ``tasks`` (what the heartbeat reports as leased) from now on; if this process
        still runs an earlier lease of the same job, that run stays listed until it has ended,
        and this one lists itself then."""
        self._served(lease)
        running = _Running(lease, job)
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
            await self.leases.finish(lease, finished=False, delay_ms=None)
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
        if self.tasks.get(running.lease.job_id) is task:
            if not task.cancelled() and task.exception() is None:
                del self.tasks[running.lease.job_id]
            else:
                self._failed.append(running.lease.job_id)
        running.task = None  # the task keeps its context, which holds ``running``: no cycle left

    def _ended(self, lease: Lease, end: _RunEnd) -> None:
        if not end.done.done():
            end.done.set_result(None)
        if self._ends.get(lease.job_id) is end.done:
            del self._ends[lease.job_id]

    def _hand_over(self, running: _Running) -> Handoff:
        """The LEASE that takes the next job of a slot whose job is ending, sent with that job's
        SETTLE: the job starts as soon as the reply is read, without waiting for this loop's
        next look, a round trip later. Only if the worker is full as the SETTLE goes out (one
        with a free slot already waits on the wake list, with LEASE behind its BLPOP, and one
        that drains takes nothing), and not when every partition is known to be empty: the
        freed slot then waits for work (``_next_with_work``)."""
        return self.leases.hand_over(
            lease_ms=int(self.in_progress_timeout_s * 1000), look_ahead=self.queue_read_limit,
            wanted=self._wants_next, on_taken=functools.partial(self._take_over, running=running))

    def leased(self) -> list[str]:
        """The ids of the jobs this worker runs: arq's tasks, by job id. One C-level copy of the
        keys: safe to call from another thread (the heartbeat's)."""
        return list(self.tasks)

    def _stopping(self) -> bool:
        """Past its drain: arq has cancelled its main task (and every job listed then). Told by
        the task's cancellation count, so no routine wait of the main task may time out by
        cancelling it (``_wait_for_work``: a full worker's wait for a slot); the one that does,
        a wait for work on a node that stopped answering (``Leases.wait_and_take``), is rare."""
        main = self.main_task
        return main is not None and (main.done() or _cancelling(main))

    def _wants_next(self) -> str | None:
        """The queue a SETTLE's LEASE takes the slot's next job from, if any (``_hand_over``)."""
        if not (self.allow_pick_jobs and self.job_counter >= self.max_jobs):
            return None
        index = self._next_with_work()
        return None if index is None else self.queues[index]

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
            job = self._admit(lease)
            running.handed = True
            self._run(lease, end, job)

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
        return self.leases.finish(running.lease, finished=finish, delay_ms=incr_score)

    async def finish_failed_job(self, job_id: str, result_data: bytes | None) -> None:
        running = _running.get()
        if running is not None:
            await self.leases.finish(running.lease, finished=True, delay_ms=None)

    def _release_sem_dec_counter_on_complete(self) -> None:
        # A worker that was full popped no tokens: jobs may have come due that nobody took
        # (a backlog): look again at once. One with a free slot already waits for tokens.
        was_full = self.job_counter >= self.max_jobs
        super()._release_sem_dec_counter_on_complete()
        if was_full:
            self._slot_freed.set()


class _Backstop:
    """arq's job timeout, kept by the job's own task: past ``seconds`` it is cancelled, and ends
    in ``TimeoutError`` (as ``asyncio.timeout`` would have it) unless something else cancelled it
    too. arq's own, a ``wait_for`` around the job's task, cost every job a future, a timer, a
    callback and a turn of the loop more as it ended; arq is given none (``job_timeout_s``)."""

    __slots__ = ("_fired", "_task", "_timer")

    def __init__(self, seconds: float) -> None:
        loop = running_loop()
        task = asyncio.current_task(loop)
        if task is None:  # pragma: no cover - arq runs every job in a task
            raise RuntimeError("a job runs in a task")
        self._task = task
        self._fired = False
        self._timer = loop.call_later(seconds, self._fire)

    def _fire(self) -> None:
        self._fired = True
        self._task.cancel()

    def expired(self) -> bool:
        """Whether the job's cancellation was this backstop's alone."""
        return self._fired and self._task.uncancel() == 0

    def stop(self) -> None:
        self._timer.cancel()


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
        backstop = _Backstop(backstop_s)
        try:
            await execute(ctx, payload)
        except asyncio.CancelledError:
            if backstop.expired():
                raise TimeoutError(f"the job ran past arq's timeout ({backstop_s} s)") from None
            raise
        finally:
            backstop.stop()

    async def execute(ctx: dict[str, Any], payload: bytes) -> None:
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

    # Our runtime enforces each tool's timeout; arq's only backs it up (kept by _Backstop).
    backstop_s = max_timeout + ARQ_TIMEOUT_MARGIN_S
    worker = WakeableWorker(
        functions=[func(carmy_execute, name=jobs.FUNCTION, max_tries=_ARQ_MAX_TRIES)],
        redis_pool=pool,
        # arq names its status line after it (the only key arq itself writes): partition 0's.
        queue_name=jobs.queue_name(group, 0),
        max_jobs=concurrency,
        keep_result=0,  # results are our records, not arq's
        job_serializer=serialize,
        job_deserializer=deserialize,
        job_completion_wait=int(drain_seconds) + 1,
        on_shutdown=cast("StartupShutdown | None", on_shutdown),
        log_results=False,
        health_check_interval=3600,
        job_timeout=backstop_s,  # what arq's leases are sized from (in_progress_timeout_s)
    )
    worker.job_timeout_s = None  # type: ignore[assignment]  # run_job then awaits the job's task as it is: _Backstop times it
    worker.on_drain = on_drain
    worker.admit, worker.forget = admit, forget
    worker.leases = Leases(pool, worker_id, durability=durability)
    worker.queues = [jobs.queue_name(group, partition) for partition in keys.partitions()]
    return worker


# A reply later than this (plus the WAIT for replicas, when asked for) means Redis hangs or is
# cut off without a reset (a primary stopped, or on the far side of a network partition): the
# command fails as a lost connection does, and the next one connects again: behind Sentinel, to
# the replica promoted meanwhile; on a cluster, after the client has rebuilt its slot table
# (``store.cluster``). Without it, an outcome on its way, the job loop's pass, the janitor and the
# callbacks waited for the node to wake, or for TCP to give up. Long enough for the slowest script
# a busy Redis runs (a heartbeat over thousands of executions: tens of ms). The waits for work
# are bounded on their own (``store.leases.WAIT_GRACE_S``), and the cancel listener, whose
# subscription may stay silent for hours, has a client without it (``runtime.service``).
REPLY_TIMEOUT_S = 5.0


def connect(redis: RedisConnector | str, *, reply_timeout: float | None = None, **options: Any) -> ArqRedis:
    """A redis-py client for ``CARMY_REDIS_URL`` that arq's worker accepts as its pool, whose
    replies time out after ``reply_timeout`` s (None: never); on a cluster, a ``StoreCluster``
    typed as one: arq only sends it single-key commands and closes it (``store.cluster`` lists
    what)."""
    connector = redis if isinstance(redis, RedisConnector) else RedisConnector(redis)
    if connector.is_cluster:
        return cast("ArqRedis", connector.client(socket_connect_timeout=1.0, socket_timeout=reply_timeout, **options))
    return ArqRedis(connection_pool=connector.pool(socket_connect_timeout=1.0, socket_timeout=reply_timeout,
                                                   **options))
