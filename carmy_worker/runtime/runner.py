"""What a worker does with one job: claim it, run the tool, record the outcome once."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec
from redis.asyncio import Redis
from redis.exceptions import RedisError

from carmy_worker.logs import info_line, request_id_hash
from carmy_worker.loop import Signal, running_loop
from carmy_worker.runtime.invoke import Outcome, decode, invoke
from carmy_worker.runtime.lock import ToolLock
from carmy_worker.runtime.publisher import ProgressPublisher
from carmy_worker.sdk.context import AgentContext, Context
from carmy_worker.sdk.errors import error
from carmy_worker.sdk.toolbox import Tool
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import records
from carmy_worker.store.attempts import MAX_ATTEMPTS, Attempts, Claim, ClaimVerdict
from carmy_worker.store.batch import FollowUp
from carmy_worker.store.durable import Durability
from carmy_worker.store.locks import ToolLocks
from carmy_worker.store.progress import Progress
from carmy_worker.store.roster import Holding, Stray
from carmy_worker.store.verdicts import Verdicts
from carmy_worker.tracing import trace_id_of, with_trace_id
from carmy_worker.wire import ExecutionJob, Record, completed_event, job_decoder

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from carmy_worker.tracing import Tracing

log = logging.getLogger("carmy.worker")

# How long a cancellation heard before its execution started here is remembered (it only has to
# outlive one LEASE round trip; every worker hears every cancellation, so it must not pile up).
EARLY_CANCEL_MEMORY_S = 10.0
# Recording an outcome is retried through a Redis restart (about a minute with the backoff).
SETTLE_TRIES = 40
RELEASE_WAIT_S = 5.0  # how long a stopping worker waits for its tools' lock releases (one command each)


@dataclass
class Run:
    """One attempt at an execution, as this worker sees it."""

    job: ExecutionJob
    attempt: int
    queue_wait_ms: int
    run_ms: int | None = None
    ran: bool = False  # its claim said run: this worker holds the execution (else it records a verdict)
    lease: str = ""  # the token of the job's lease, which its SETTLE ends ('' to leave that to FINISH)
    claimed_at: float = field(default_factory=time.monotonic)  # when its claim was sent
    lease_ended: bool = False  # a SETTLE with the lease was written: the job is finished and gone
    then: FollowUp | None = None  # sent right behind its first SETTLE (the queue's LEASE of the next job)
    cancelled: Signal = field(default_factory=Signal)
    ctx: Context | None = None
    lock: str = ""  # the key of the tool's lock while this attempt holds it (``locked``)
    # What a heartbeat names for it, made when it changes: a full beat's snapshot of 10,000 held
    # makes no object per execution while the heartbeat thread holds the GIL (the loop waits).
    holding: Holding = field(init=False)
    # Set from any thread (the heartbeat's too); the tool sees them before its next step.
    lost: str = ""  # why this attempt no longer holds its execution: its outcome is not recorded
    unlocked: bool = False  # it lost the tool's lock while it ran: it ends uncertain
    loop: asyncio.AbstractEventLoop = field(default_factory=running_loop)

    def __post_init__(self) -> None:
        self.holding = Holding(self.job.execution_id, self.attempt, self.lock)

    def locked(self, key: str) -> None:
        """This attempt holds the tool's lock ``key`` ('': no longer)."""
        self.lock = key
        self.holding = Holding(self.job.execution_id, self.attempt, key)

    @property
    def halted(self) -> bool:
        return bool(self.lost) or self.unlocked

    def stop(self) -> None:
        """Stop the tool; safe from any thread."""
        self.loop.call_soon_threadsafe(self._stop)

    def _stop(self) -> None:
        self.cancelled.set()
        if self.ctx is not None:
            self.ctx._cancel()


class Runtime:
    """Runs the jobs of one worker process. Built once, shared by all its jobs."""

    def __init__(self, *, redis: Redis, tools: dict[str, Tool], settings: WorkerSettings, worker_id: str,
                 durability: Durability | None = None, group: str | None = None,
                 tracing: Tracing | None = None) -> None:
        self.redis = redis
        self.tracing = tracing  # None: tracing is off, and no span is made
        self.tools = tools
        self.settings = settings
        self.worker_id = worker_id
        # Twice the concurrency: threads of timed-out sync tools may still be finishing.
        self._threads = ThreadPoolExecutor(max_workers=settings.concurrency * 2, thread_name_prefix="carmy-tool")
        # The attempts this worker holds, from their claim until their record is written: what
        # its heartbeat reports, and what a cancellation or a lost lease stops.
        self._runs: dict[str, Run] = {}
        # Claims LEASE made whose job arq has not handed to ``handle`` yet, by lease token.
        self._admitted: dict[str, tuple[Run, ClaimVerdict]] = {}
        # Cancellations heard for executions not (yet) running here, by when they were heard: a
        # cancel published while this worker's LEASE was in flight arrives before the execution
        # is registered in _runs, and must not be lost.
        self._early_cancels: OrderedDict[str, float] = OrderedDict()
        self._releases: set[asyncio.Task[None]] = set()  # lock releases still in flight
        # The runs of _runs that hold their tool's lock, for the heartbeat to read the locks of.
        self._locked: dict[str, Run] = {}
        # With its queues' group known, SETTLE also ends the lease of the job it settles (no FINISH after it).
        self._attempts = Attempts(redis, worker_id=worker_id, retention=settings.retention, durability=durability,
                                  group=group)
        self._verdicts = Verdicts(redis, retention=settings.retention, durability=durability)
        self._locks = ToolLocks(redis, worker_id=worker_id, durability=durability)
        self._progress = Progress(redis, worker_id=worker_id)
        # Called before each step of an async tool, and before an outcome is recorded: None while
        # the heartbeat is fresh; once it has gone stale, the check the worker's presence makes of
        # whether it still holds its executions, for the step (or the record) to wait for (one
        # at a time, shared by every step that asks meanwhile).
        self.check_if_stale: Callable[[], Awaitable[None] | None] = lambda: None
        # Set when this worker may have left a stray behind (a claim let go, an outcome or a
        # stray's settle that Redis failed); its presence then sends a full heartbeat next, which
        # finds strays, rather than waiting for the next due one (presence.FULL_EVERY).
        self.unsure = False
        # Sets of what was admitted while a full heartbeat was out (``watch_admits``), one per
        # beat under way; replaced, never changed in place, so that ``admit`` may read it while
        # the heartbeat thread swaps it.
        self._watchers: tuple[set[str], ...] = ()
        # Swaps of it, from two threads at once (the heartbeat's and ensure_fresh's checks'),
        # one at a time: neither drops the set the other added.
        self._watching = threading.Lock()

    @property
    def running(self) -> int:
        return len(self._runs)

    def holdings(self) -> list[Holding]:
        """What this worker holds, for its heartbeat to check (safe to call from another thread)."""
        return [r.holding for r in list(self._runs.values())]

    def locked_holdings(self) -> list[Holding]:
        """What this worker holds with a tool lock (safe to call from another thread): as many
        steps as there are, not as executions held."""
        return [r.holding for r in list(self._locked.values())]

    def attempt_of(self, exec_id: str, *, claimed_before: float) -> int | None:
        """The attempt this worker holds at ``exec_id`` if its claim was sent before
        ``claimed_before`` (``time.monotonic``), else None: what a heartbeat sent then may judge
        (safe to call from another thread)."""
        run = self._runs.get(exec_id)
        return run.attempt if run is not None and run.claimed_at < claimed_before else None

    def cancel(self, exec_id: str) -> None:
        """The caller of ``exec_id`` went away; stop it if it runs here."""
        run = self._runs.get(exec_id)
        if run is not None:
            run.cancelled.set()
            return
        now = time.monotonic()
        self._early_cancels.pop(exec_id, None)  # a repeat goes to the end, keeping the order by time
        self._early_cancels[exec_id] = now
        while self._early_cancels and next(iter(self._early_cancels.values())) < now - EARLY_CANCEL_MEMORY_S:
            self._early_cancels.popitem(last=False)

    def lose(self, exec_id: str, attempt: int, why: str) -> None:
        """This worker no longer holds ``attempt`` at ``exec_id`` (the janitor reaped it while the
        worker was paused or cut off from Redis, or another attempt settled it): stop the tool
        before it takes another step, and record nothing for it. Safe from any thread."""
        run = self._runs.get(exec_id)
        if run is None or run.attempt != attempt or run.lost:
            return
        run.lost = why
        log.warning("execution %s: this worker lost it (%s); stopping its tool", exec_id, why)
        run.stop()

    def unlock(self, exec_id: str, attempt: int) -> None:
        """``attempt`` lost the tool's lock (its lease ran out while the worker was paused):
        another execution may be running the tool, so this one stops and ends uncertain. Safe
        from any thread."""
        run = self._runs.get(exec_id)
        if run is None or run.attempt != attempt or run.unlocked or not run.lock:
            return
        run.unlocked = True
        log.warning("execution %s lost the lock of tool %s; stopping it", exec_id, run.job.tool)
        run.stop()

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def released(self, timeout: float = RELEASE_WAIT_S) -> None:
        """Until the tools' locks being released are, ``timeout`` s at most: a worker that stops
        releases them rather than leave the next caller of a parallel-unsafe tool to wait for
        their lease, and none is sent once the worker's connections are closed (it opened one
        again, which nothing closed)."""
        if self._releases:
            await asyncio.wait(set(self._releases), timeout=timeout)

    def admit(self, payload: bytes, claim: Claim, lease: str, sent_at: float) -> None:
        """LEASE, sent at ``sent_at`` (``time.monotonic``), claimed the execution of ``payload``
        for this worker, under ``lease``: hold it from now on (the heartbeat reports it), until
        ``handle`` runs it. Called on the event loop, before anything else runs there."""
        try:
            job = job_decoder.decode(payload)
        except msgspec.DecodeError:
            return  # handle says so; the heartbeat settles the claim as a stray
        self._admitted[lease] = (self._claimed(job, claim, lease, sent_at), claim.verdict)
        for admitted in self._watchers:
            admitted.add(job.execution_id)

    @contextlib.contextmanager
    def watch_admits(self) -> Iterator[set[str]]:
        """The executions admitted from now until the block ends (safe from another thread): a
        full heartbeat, whose snapshot of what the worker holds is taken first, finds these
        listed as running on the worker and leased to it, but not named. They are neither strays
        nor orphans."""
        admitted: set[str] = set()
        with self._watching:
            self._watchers = (*self._watchers, admitted)
        try:
            yield admitted
        finally:
            with self._watching:
                self._watchers = tuple(w for w in self._watchers if w is not admitted)

    def forget(self, lease: str) -> None:
        """arq is done with ``lease``'s job. If it never handed the job to ``handle``, the claim
        is let go: the next heartbeat, a full one (``unsure``), finds the execution a stray, and
        it is settled by the one after."""
        admitted = self._admitted.pop(lease, None)
        if admitted is None:
            return
        run = admitted[0]
        log.warning("execution %s was claimed but its job never reached the handler", run.job.execution_id)
        if self._runs.get(run.job.execution_id) is run:
            del self._runs[run.job.execution_id]
        # Once it is no longer held: a full beat that reads the holdings after this names it a stray.
        self.unsure = True

    async def handle(self, payload: bytes, lease: str = "", then: FollowUp | None = None) -> bool:
        """Entry point for one arq job. Failures are recorded as data; only a shutdown
        (CancelledError) or Redis failing before anything could be recorded gets out.
        True: the record's SETTLE also ended the lease (the job is finished and gone).

        Its execution was claimed with ``lease`` (``admit``); a job run under no such claim is
        claimed here first (one more round trip). ``then`` goes out right behind the first
        SETTLE of its record, in the same write (``Attempts.settle``)."""
        admitted = self._admitted.pop(lease, None) if lease else None
        if admitted is not None:
            run, verdict = admitted
        else:
            try:
                job = job_decoder.decode(payload)
            except msgspec.DecodeError as exc:
                log.error("dropping an undecodable job: %s", exc)
                return False
            sent_at = time.monotonic()
            claim = await self._attempts.claim(job.execution_id, max_attempts=MAX_ATTEMPTS, lease=lease)
            run, verdict = self._claimed(job, claim, lease, sent_at), claim.verdict
        run.then = then
        job = run.job
        if self.tracing is not None and job.traceparent:
            # SUBMIT to the claim, as Redis's clock measured it, ending now.
            claimed_ns = time.time_ns()
            self.tracing.interval("carmy.queued", job.traceparent, {
                "carmy.execution_id": job.execution_id, "carmy.tool": job.tool, "carmy.attempt": run.attempt,
                "carmy.claim": verdict}, claimed_ns - run.queue_wait_ms * 1_000_000, claimed_ns)
        try:
            await self._conclude(run, verdict)
        except (asyncio.CancelledError, RedisError):
            raise  # shutting down; or Redis failed before the outcome was recorded: the job goes back
        except BaseException as exc:  # whatever got past every other net (a KeyboardInterrupt too)
            await self._last_resort(run, exc)
        finally:
            if self._runs.get(job.execution_id) is run:
                del self._runs[job.execution_id]
        return run.lease_ended

    def _claimed(self, job: ExecutionJob, claim: Claim, lease: str, sent_at: float) -> Run:
        """The attempt ``claim`` gave this worker, held from now on if it may run."""
        run = Run(job=job, attempt=claim.attempt, queue_wait_ms=claim.queue_wait_ms,
                  lease=lease if self._attempts.group is not None else "", ran=claim.verdict == "run",
                  claimed_at=sent_at)
        if run.ran:
            self._hold(run)
        return run

    def _hold(self, run: Run) -> None:
        exec_id = run.job.execution_id
        earlier = self._runs.get(exec_id)
        if earlier is not None:  # an older attempt still winding down here: it cannot be current
            self.lose(exec_id, earlier.attempt, "a newer attempt started")
        self._runs[exec_id] = run
        if self._early_cancels.pop(exec_id, None) is not None:
            run.cancelled.set()

    async def _conclude(self, run: Run, verdict: ClaimVerdict) -> None:
        exec_id, name = run.job.execution_id, run.job.tool
        tool = self.tools.get(name)
        if verdict == "run" and tool is not None:
            await self._run(run, tool)
        elif verdict == "run":  # the catalog and this worker disagree (a rolling deploy)
            await self._record(run, records.failed(exec_id, name, error(
                "TOOL_NOT_FOUND", f"No tool named {name!r} on this worker.")))
        elif verdict == "cancelled":
            await self._record(run, records.cancelled(exec_id, name, started=False))
        elif verdict == "uncertain":
            await self._record(run, records.uncertain(exec_id, name, "its worker stopped"))
        elif verdict == "expired":
            await self._record(run, records.never_started(exec_id, name))

    async def _last_resort(self, run: Run, exc: BaseException) -> None:
        """Settle ``TOOL_PANIC`` from constant parts, so that no job ends without a record."""
        exec_id = run.job.execution_id
        log.error("execution %s: its outcome could not be recorded; recording TOOL_PANIC instead", exec_id,
                  exc_info=exc)
        record = records.panic(exec_id, run.job.tool)
        try:
            await self._record(run, record)
        except (asyncio.CancelledError, RedisError):
            raise
        except BaseException as again:  # in the execution's log line, say: still record it
            log.error("execution %s: recording TOOL_PANIC failed too; trying once more", exec_id, exc_info=again)
            if await self._attempts.settle(record, exec_id=exec_id, attempt=run.attempt, ran=run.ran, lease=run.lease):
                run.lease_ended = bool(run.lease)

    async def _run(self, run: Run, tool: Tool) -> None:
        job = run.job
        loop = run.loop
        publisher = ProgressPublisher(self._progress, job.execution_id, run.attempt, loop)
        agent = AgentContext(
            principal=job.principal, session=job.session, permissions=frozenset(job.permissions), metadata=job.metadata
        )
        run.ctx = Context(execution_id=job.execution_id, tool=tool.name, request_id=job.request_id, agent=agent,
                          emit=publisher.emit, attempt=run.attempt,
                          # Not a closure over run: run holds the context, and a cycle would
                          # leave the whole execution's objects to the garbage collector.
                          holds=functools.partial(self._attempts.holds, job.execution_id, run.attempt),
                          trace_id=trace_id_of(job.traceparent))
        timeout = tool.timeout or self.settings.default_timeout
        span: Span | None = None
        if self.tracing is not None and job.traceparent:
            span = self.tracing.start("carmy.run", job.traceparent, {
                "carmy.execution_id": job.execution_id, "carmy.tool": tool.name, "carmy.attempt": run.attempt})
        start = time.perf_counter()
        try:
            outcome = await self._invoke(run, tool, timeout)
            if span is not None:
                span.set_attribute("carmy.outcome", _outcome_name(outcome))
        except asyncio.CancelledError:
            # The worker is shutting down past its drain time. A tool that may not run twice
            # is settled uncertain now; any other goes back to the queue for another worker.
            await asyncio.shield(self._give_back(job))
            raise
        finally:
            await publisher.close()
            if span is not None:
                span.end()
        run.run_ms = round((time.perf_counter() - start) * 1000)
        # A worker that was paused checks before it records, as before a tool's step (a check
        # may be under way already: the loop runs on meanwhile, and a timeout, a cancel or a
        # lost lock may have ended the tool first). An attempt it lost records nothing.
        if (checking := self.check_if_stale()) is not None:
            await checking
        if run.lost:
            log.warning("execution %s: the outcome of attempt %d is dropped (%s)", job.execution_id, run.attempt,
                        run.lost)
            return
        if run.unlocked:
            record = records.uncertain(job.execution_id, tool.name, "it lost the tool's lock while it ran")
        else:
            record = self._record_of(job, tool, outcome, timeout, run.run_ms, asked=run.cancelled.is_set())
        await self._record(run, record, completed_event(job.execution_id, tool.name, run.run_ms,
                                                        outcome.data is not None))

    async def _invoke(self, run: Run, tool: Tool, timeout: float) -> Outcome:
        job, ctx, cancelled = run.job, run.ctx, run.cancelled
        assert ctx is not None
        def may_step() -> bool | Awaitable[None]:
            if run.halted:
                return False
            checking = self.check_if_stale()
            return True if checking is None else checking  # after it, asked again

        # Arguments the tool would never get are refused before anything is taken for the call:
        # BEGIN's mark (a worker dying after it would leave "may have run") or the tool's lock.
        arguments = decode(tool, job.arguments)
        if isinstance(arguments, Outcome):
            return arguments
        if not await self._still_holds(run, tool):
            self.lose(job.execution_id, run.attempt, "it went to another attempt before its tool began")
            return Outcome(cancelled=True)
        if tool.spec.parallel_safe:
            return await invoke(tool, ctx, arguments, timeout=timeout, executor=self._threads,
                                cancelled=cancelled, max_result_bytes=self.settings.max_result_bytes,
                                may_step=may_step)
        # One at a time across all workers; the wait counts against the timeout.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        lock = ToolLock(self._locks, tool.name, job.execution_id, run.attempt,
                        on_lost=lambda: self.unlock(job.execution_id, run.attempt))
        acquired = await lock.acquire(timeout, cancelled)
        if acquired == "lost":
            self.lose(job.execution_id, run.attempt, "it went to another attempt while it waited for its lock")
        if acquired != "taken":
            return Outcome(timed_out=True) if acquired == "timed_out" else Outcome(cancelled=True)
        run.locked(lock.key)
        self._locked[job.execution_id] = run

        # Released when the call has really ended: a timed-out sync tool's thread still holds it.
        def release() -> None:
            run.locked("")
            if self._locked.get(job.execution_id) is run:
                del self._locked[job.execution_id]
            task = loop.create_task(lock.release())
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

        return await invoke(tool, ctx, arguments, timeout=deadline - loop.time(), executor=self._threads,
                            cancelled=cancelled, max_result_bytes=self.settings.max_result_bytes, on_end=release,
                            may_step=may_step)

    async def _still_holds(self, run: Run, tool: Tool) -> bool:
        """Whether ``run`` may start its tool. A tool that may not run twice is marked as begun
        first (BEGIN; a lock marks a ``parallel_safe=False`` one). Any other asks Redis only if
        its claim is old: a LEASE queued behind a BLPOP runs even while its worker is stopped,
        and a worker that wakes up more than ``dead_after``/2 later may find its execution given
        to another (``Runtime.lose`` stops only what has started)."""
        exec_id = run.job.execution_id
        if run.lost:
            return False
        if tool.spec.parallel_safe and not tool.spec.idempotent:
            return await self._attempts.begin(exec_id, run.attempt)
        if time.monotonic() - run.claimed_at > self.settings.dead_after / 2:
            return await self._attempts.holds(exec_id, run.attempt)
        return True

    def _record_of(self, job: ExecutionJob, tool: Tool, outcome: Outcome, timeout: float, duration_ms: int, *,
                   asked: bool) -> Record:
        """``asked``: a stop was asked for (the cancel signal is set)."""
        exec_id = job.execution_id
        if outcome.data is not None:
            return records.completed(exec_id, tool.name, outcome.data, cacheable=records.is_cacheable(tool.spec),
                                     duration_ms=duration_ms)
        if outcome.error is not None:
            return records.failed(exec_id, tool.name, outcome.error, duration_ms=duration_ms)
        if outcome.timed_out:
            return records.timed_out(exec_id, tool.name, timeout, idempotent=tool.spec.idempotent,
                                     duration_ms=duration_ms)
        # Cancelled unasked is the tool's own CancelledError: every other way to a cancelled
        # outcome (a refused step, a lock or a hold lost) leaves the attempt lost, which records
        # nothing, or unlocked, which records EXECUTION_UNCERTAIN instead.
        return records.cancelled(exec_id, tool.name, started=True, idempotent=tool.spec.idempotent,
                                 duration_ms=duration_ms, by_itself=not asked)

    async def _record(self, run: Run, record: Record, completed: bytes | None = None) -> bool:
        """Write the record if this attempt still owns the execution; log the execution line.

        Redis errors are retried (about a minute); past that, the last one is raised, so that
        the job goes back to the queue rather than being finished without a record.
        """
        exec_id = run.job.execution_id
        trace_id = trace_id_of(run.job.traceparent)
        if trace_id is not None:  # every replay of the result names the execution's trace
            record = msgspec.structs.replace(record, body=with_trace_id(record.body, trace_id))
        delay = 0.1
        for tries in range(1, SETTLE_TRIES + 1):
            then, run.then = run.then, None  # with the first try only: a retry must not take a job again
            try:
                written = await self._attempts.settle(record, exec_id=exec_id, attempt=run.attempt,
                                                      completed_event=completed, run_ms=run.run_ms, ran=run.ran,
                                                      lease=run.lease, then=then)
                break
            except RedisError as exc:  # Redis is restarting: the outcome is worth waiting for
                self.unsure = True  # its reply may be what was lost, the write made
                if tries == SETTLE_TRIES:
                    log.error("gave up recording execution %s after %d tries; its job goes back to the queue",
                              exec_id, SETTLE_TRIES)
                    raise
                log.warning("cannot record execution %s yet (%s); retrying", exec_id, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        if log.isEnabledFor(logging.INFO):  # the fields are built only for a line that is written
            info_line(log, "execution", {
                "event": "execution", "execution_id": exec_id, "request_id_hash": request_id_hash(run.job.request_id),
                "tool": record.tool, "status": record.status, "error_code": record.error_code,
                "queue_wait_ms": run.queue_wait_ms, "run_ms": run.run_ms, "attempt": run.attempt,
                "worker": self.worker_id, "recorded": written,
            })
        if written:
            run.lease_ended = bool(run.lease)
        else:
            log.warning("execution %s was already settled elsewhere; this attempt's outcome is dropped", exec_id)
        return written

    async def reap_stray(self, stray: Stray) -> None:
        """Settle or re-queue an execution listed as running here that this worker does not hold."""
        if stray.execution_id in self._runs:
            return
        try:
            outcome = await self._verdicts.reap(stray.execution_id, stray.tool, worker_id=self.worker_id,
                                                why="its outcome was never recorded", attempt=stray.attempt)
        except RedisError as exc:  # the next heartbeats find it again
            self.unsure = True
            log.warning("could not settle stray execution %s: %s", stray.execution_id, exc)
            return
        log.warning("execution %s was listed as running here without running: %s", stray.execution_id, outcome)

    async def _give_back(self, job: ExecutionJob) -> None:
        try:
            await self._verdicts.reap(job.execution_id, job.tool, worker_id=self.worker_id, why="its worker shut down")
        except Exception as exc:  # the janitor of another process will do it
            log.warning("could not hand execution %s back: %s", job.execution_id, exc)


def _outcome_name(outcome: Outcome) -> str:
    """How the tool's call ended, for its span."""
    if outcome.data is not None:
        return "completed"
    if outcome.error is not None:
        return "failed"
    return "timed_out" if outcome.timed_out else "cancelled"
