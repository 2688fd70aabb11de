"""What a worker does with one job: claim it, run the tool, record the outcome once."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import msgspec
from redis.asyncio import Redis
from redis.exceptions import RedisError

from carmy_worker.logs import request_id_hash
from carmy_worker.runtime.invoke import Outcome, invoke
from carmy_worker.runtime.lock import ToolLock
from carmy_worker.runtime.publisher import ProgressPublisher
from carmy_worker.sdk.context import AgentContext, Context
from carmy_worker.sdk.errors import error
from carmy_worker.sdk.toolbox import Tool
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import records
from carmy_worker.store.attempts import Attempts, ClaimVerdict
from carmy_worker.store.durable import Durability
from carmy_worker.store.verdicts import Verdicts
from carmy_worker.wire import ExecutionJob, Record, completed_event, job_decoder

log = logging.getLogger("carmy.worker")

# An idempotent execution interrupted this many times is given up as uncertain.
MAX_ATTEMPTS = 3
# How long a cancellation heard before its execution started here is remembered (it only has to
# outlive one CLAIM round trip; every worker hears every cancellation, so it must not pile up).
EARLY_CANCEL_MEMORY_S = 10.0
# Recording an outcome is retried through a Redis restart (about a minute with the backoff).
SETTLE_TRIES = 40


@dataclass
class Run:
    """One attempt at an execution, as this worker sees it."""

    job: ExecutionJob
    attempt: int
    queue_wait_ms: int
    run_ms: int | None = None


class Runtime:
    """Runs the jobs of one worker process. Built once, shared by all its jobs."""

    def __init__(self, *, redis: Redis, tools: dict[str, Tool], settings: WorkerSettings, worker_id: str,
                 durability: Durability | None = None) -> None:
        self.redis = redis
        self.tools = tools
        self.settings = settings
        self.worker_id = worker_id
        # Twice the concurrency: threads of timed-out sync tools may still be finishing.
        self._threads = ThreadPoolExecutor(max_workers=settings.concurrency * 2, thread_name_prefix="carmy-tool")
        self._cancels: dict[str, asyncio.Event] = {}
        # Cancellations heard for executions not (yet) running here, by when they were heard: a
        # cancel published while this worker's CLAIM was in flight arrives before the execution
        # is registered in _cancels, and must not be lost.
        self._early_cancels: OrderedDict[str, float] = OrderedDict()
        self._releases: set[asyncio.Task[None]] = set()  # lock releases still in flight
        self._attempts = Attempts(redis, worker_id=worker_id, retention=settings.retention, durability=durability)
        self._verdicts = Verdicts(redis, retention=settings.retention, durability=durability)

    @property
    def running(self) -> int:
        return len(self._cancels)

    def cancel(self, exec_id: str) -> None:
        """The caller of ``exec_id`` went away; stop it if it runs here."""
        event = self._cancels.get(exec_id)
        if event is not None:
            event.set()
            return
        now = time.monotonic()
        self._early_cancels[exec_id] = now
        while self._early_cancels and next(iter(self._early_cancels.values())) < now - EARLY_CANCEL_MEMORY_S:
            self._early_cancels.popitem(last=False)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def handle(self, payload: bytes) -> None:
        """Entry point for one arq job. Failures are recorded as data; only a shutdown
        (CancelledError) or Redis failing before anything could be recorded gets out."""
        try:
            job = job_decoder.decode(payload)
        except msgspec.DecodeError as exc:
            log.error("dropping an undecodable job: %s", exc)
            return
        claim = await self._attempts.claim(job.execution_id, job.tool, max_attempts=MAX_ATTEMPTS)
        run = Run(job=job, attempt=claim.attempt, queue_wait_ms=claim.queue_wait_ms)
        try:
            await self._conclude(run, claim.verdict)
        except (asyncio.CancelledError, RedisError):
            raise  # shutting down; or Redis failed before the outcome was recorded: the job goes back
        except BaseException as exc:  # whatever got past every other net (a KeyboardInterrupt too)
            await self._last_resort(run, exc)

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
            await self._attempts.settle(record, exec_id=exec_id, attempt=run.attempt)

    async def _run(self, run: Run, tool: Tool) -> None:
        job = run.job
        loop = asyncio.get_running_loop()
        publisher = ProgressPublisher(self.redis, job.execution_id, loop)
        agent = AgentContext(
            principal=job.principal, session=job.session, permissions=frozenset(job.permissions), metadata=job.metadata
        )
        ctx = Context(execution_id=job.execution_id, tool=tool.name, request_id=job.request_id, agent=agent,
                      emit=publisher.emit)
        timeout = tool.timeout or self.settings.default_timeout
        cancelled = self._cancels[job.execution_id] = asyncio.Event()
        if self._early_cancels.pop(job.execution_id, None) is not None:
            cancelled.set()
        start = time.perf_counter()
        try:
            outcome = await self._invoke(job, tool, ctx, timeout, cancelled)
        except asyncio.CancelledError:
            # The worker is shutting down past its drain time. A tool that may not run twice
            # is settled uncertain now; any other goes back to the queue for another worker.
            await asyncio.shield(self._give_back(job))
            raise
        finally:
            del self._cancels[job.execution_id]
            await publisher.close()
        run.run_ms = round((time.perf_counter() - start) * 1000)
        record = self._record_of(job, tool, outcome, timeout, run.run_ms)
        await self._record(run, record, completed_event(job.execution_id, tool.name, run.run_ms,
                                                        outcome.data is not None))

    async def _invoke(self, job: ExecutionJob, tool: Tool, ctx: Context, timeout: float,
                      cancelled: asyncio.Event) -> Outcome:
        if tool.spec.parallel_safe:
            return await invoke(tool, ctx, job.arguments, timeout=timeout, executor=self._threads,
                                cancelled=cancelled, max_result_bytes=self.settings.max_result_bytes)
        # One at a time across all workers; the wait counts against the timeout.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        lock = ToolLock(self.redis, tool.name, job.execution_id)
        if not await lock.acquire(timeout, cancelled):
            return Outcome(cancelled=True) if cancelled.is_set() else Outcome(timed_out=True)
        # Released when the call has really ended: a timed-out sync tool's thread still holds it.
        def release() -> None:
            task = loop.create_task(lock.release())
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

        return await invoke(tool, ctx, job.arguments, timeout=deadline - loop.time(), executor=self._threads,
                            cancelled=cancelled, max_result_bytes=self.settings.max_result_bytes, on_end=release)

    def _record_of(self, job: ExecutionJob, tool: Tool, outcome: Outcome, timeout: float, duration_ms: int) -> Record:
        exec_id = job.execution_id
        if outcome.data is not None:
            return records.completed(exec_id, tool.name, outcome.data, cacheable=records.is_cacheable(tool.spec),
                                     duration_ms=duration_ms)
        if outcome.error is not None:
            return records.failed(exec_id, tool.name, outcome.error, duration_ms=duration_ms)
        if outcome.timed_out:
            return records.timed_out(exec_id, tool.name, timeout, duration_ms=duration_ms)
        return records.cancelled(exec_id, tool.name, started=True, duration_ms=duration_ms)

    async def _record(self, run: Run, record: Record, completed: bytes | None = None) -> bool:
        """Write the record if this attempt still owns the execution; log the execution line."""
        exec_id = run.job.execution_id
        delay = 0.1
        for _ in range(SETTLE_TRIES):
            try:
                written = await self._attempts.settle(record, exec_id=exec_id, attempt=run.attempt,
                                                      completed_event=completed, run_ms=run.run_ms)
                break
            except RedisError as exc:  # Redis is restarting: the outcome is worth waiting for
                log.warning("cannot record execution %s yet (%s); retrying", exec_id, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        else:
            log.error("gave up recording execution %s after %d tries", exec_id, SETTLE_TRIES)
            written = False
        log.info("execution", extra={"carmy": {
            "event": "execution", "execution_id": exec_id, "request_id_hash": request_id_hash(run.job.request_id),
            "tool": record.tool, "status": record.status, "error_code": record.error_code,
            "queue_wait_ms": run.queue_wait_ms, "run_ms": run.run_ms, "attempt": run.attempt,
            "worker": self.worker_id, "recorded": written,
        }})
        if not written:
            log.warning("execution %s was already settled elsewhere; this attempt's outcome is dropped", exec_id)
        return written

    async def _give_back(self, job: ExecutionJob) -> None:
        try:
            await self._verdicts.reap(job.execution_id, job.tool, worker_id=self.worker_id, why="its worker shut down")
        except Exception as exc:  # the janitor of another process will do it
            log.warning("could not hand execution %s back: %s", job.execution_id, exc)
