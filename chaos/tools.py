"""The tools the chaos check's workers serve (``python -m carmy_worker chaos.tools``).

Each writes its side effect to the ledger (``chaos.ledger``), never to Redis: ``started``
before its work, ``effect`` at the moment the effect happens (the end of its body), or
``abandoned`` when it was cancelled first. The mix covers what the guarantees distinguish:
idempotent or not, async or sync (a thread), and one tool that is not ``parallel_safe``.

The jobs' tools (``job_put``, ``job_charge``, and ``tick`` on a schedule firing every second)
write the same lines; a run that fails on purpose writes ``failed`` instead of ``effect``.
Which attempt of its job a run is, the checker reads from its request id (``chaos.model.attempt_of``).
``named``, called without a request id (``chaos.streams``), writes none; it reports its attempt
as progress instead, from a thread that never stops early.
"""

from __future__ import annotations

import asyncio
import os
import time

import msgspec

from carmy_worker import Context, RetryPolicy, Toolbox, ToolError
from chaos.ledger import Ledger
from chaos.model import attempt_of

tools = Toolbox()
ledger = Ledger()
TIMEOUT = 10.0  # seconds, for every tool: far above their work, so a timeout means trouble
NAMED_STEP_MS = 20
# How long ``named`` works at a second attempt or later: long enough to be still running when the
# worker paused mid-first-attempt wakes (a worker-stop lasts 3.9-7.8 s; the rerun begins once
# the worker is found dead, 3-4 s in), which is when the first attempt's thread goes on reporting.
NAMED_LATER_MS = 5000
# Which release of the tools this worker serves (``chaos.faults``' ``deploy``): each release
# describes ``put`` in words of its own, so its workers make a group, and queues, of their own.
RELEASE = os.environ.get("CHAOS_RELEASE", "")


class Work(msgspec.Struct):
    ms: int  # how long the work takes before its effect
    # The check's marker (chaos.model.ARGUMENT_MARK), ignored: the audit trail must never hold it.
    mark: str = ""
    # Padding, ignored: one call in chaos.load.LARGE_EVERY is large enough to be staged.
    pad: str = ""


class Receipt(msgspec.Struct):
    """What every tool returns: which process did the effect, so that an answer recorded by
    one run and replaced by another would differ."""

    pid: int
    # The call's padding, returned: a large call's record is large too, so SETTLE's staged path
    # meets the faults as SUBMIT's does (store.staging).
    pad: str = ""


async def _async_work(ctx: Context, tool: str, ms: int, pad: str = "") -> Receipt:
    ledger.write("started", ctx, tool)
    try:
        await asyncio.sleep(ms / 1000)
    except asyncio.CancelledError:
        ledger.write("abandoned", ctx, tool)
        raise
    ledger.write("effect", ctx, tool)
    return Receipt(pid=os.getpid(), pad=pad)


def _sync_work(ctx: Context, tool: str, ms: int, careful: bool, pad: str = "") -> Receipt:
    ledger.write("started", ctx, tool)
    time.sleep(ms / 1000)
    # A well-behaved sync tool looks before it commits: its thread cannot be stopped otherwise.
    # ``ctx.cancelled`` alone races a worker's wake-up from a pause (the thread goes on at once,
    # while the runtime asks the store whether it still holds the execution), so a tool whose
    # effect must not happen twice asks the store itself.
    if ctx.cancelled or (careful and not ctx.holds_execution_blocking()):
        ledger.write("abandoned", ctx, tool)
        raise ToolError("ABANDONED", "Cancelled before the effect.", category="cancelled")
    ledger.write("effect", ctx, tool)
    return Receipt(pid=os.getpid(), pad=pad)


@tools.tool(effect="write", idempotent=False, parallel_safe=True, timeout=TIMEOUT)
async def charge(ctx: Context, input: Work) -> Receipt:
    """Not idempotent (async): its effect must never happen twice for one request."""
    return await _async_work(ctx, "charge", input.ms, input.pad)


@tools.tool(effect="write", idempotent=False, parallel_safe=True, timeout=TIMEOUT)
def charge_sync(ctx: Context, input: Work) -> Receipt:
    """Not idempotent (sync, in a thread): its effect must never happen twice for one request."""
    return _sync_work(ctx, "charge_sync", input.ms, careful=True, pad=input.pad)


def put_description(release: str) -> str:
    """``put``'s description in ``release`` ('' for the workers started with the run)."""
    return "Idempotent (async): may be run again after its worker died." + (f" Release {release}." if release else "")


@tools.tool(effect="write", idempotent=True, parallel_safe=True, timeout=TIMEOUT, description=put_description(RELEASE))
async def put(ctx: Context, input: Work) -> Receipt:
    return await _async_work(ctx, "put", input.ms, input.pad)


@tools.tool(effect="write", idempotent=True, parallel_safe=True, timeout=TIMEOUT)
def put_sync(ctx: Context, input: Work) -> Receipt:
    """Idempotent (sync, in a thread): may be run again after its worker died."""
    return _sync_work(ctx, "put_sync", input.ms, careful=False, pad=input.pad)


@tools.tool(effect="write", idempotent=False, parallel_safe=False, timeout=TIMEOUT)
async def serial(ctx: Context, input: Work) -> Receipt:
    """Not idempotent and not parallel-safe: two runs must never overlap, across all workers."""
    return await _async_work(ctx, "serial", input.ms, input.pad)


# Jobs -----------------------------------------------------------------------------------------

# Quick retries, so that a job with failures to go through still ends within seconds.
JOB_RETRY = RetryPolicy(max_attempts=4, backoff=0.2, max_backoff=1.0)
TICK = "chaos-tick"  # the schedule: one job of ``tick`` every second
# Longer than any outage a fault makes (Redis is down 4 s at most), so no occurrence may be skipped.
TICK_GRACE_S = 15.0


class Flaky(msgspec.Struct):
    ms: int  # how long the work takes before its effect
    fail: int = 0  # the job's first ``fail`` attempts fail (retryably) instead of doing the effect
    mark: str = ""  # as ``Work.mark``


class JobReceipt(msgspec.Struct):
    """Which process did the effect, and under which request id (which attempt of the job)."""

    pid: int
    request_id: str


async def _job_work(ctx: Context, tool: str, work: Flaky) -> JobReceipt:
    ledger.write("started", ctx, tool)
    try:
        await asyncio.sleep(work.ms / 1000)
    except asyncio.CancelledError:
        ledger.write("abandoned", ctx, tool)
        raise
    attempt = attempt_of(ctx.request_id or "")[1]
    if attempt <= work.fail:
        ledger.write("failed", ctx, tool)
        raise ToolError("CHAOS_FLAKY", f"attempt {attempt} fails on purpose", category="capacity", retryable=True)
    ledger.write("effect", ctx, tool)
    return JobReceipt(pid=os.getpid(), request_id=ctx.request_id or "")


@tools.tool(effect="write", idempotent=True, parallel_safe=True, timeout=TIMEOUT, retry=JOB_RETRY)
async def job_put(ctx: Context, input: Flaky) -> JobReceipt:
    """Idempotent: an attempt whose worker died is run again (the same attempt, or the next)."""
    return await _job_work(ctx, "job_put", input)


@tools.tool(effect="write", idempotent=False, parallel_safe=True, timeout=TIMEOUT, retry=JOB_RETRY)
async def job_charge(ctx: Context, input: Flaky) -> JobReceipt:
    """Not idempotent: an attempt that may have had its effect ends the job dead-lettered."""
    return await _job_work(ctx, "job_charge", input)


@tools.tool(effect="write", idempotent=False, parallel_safe=True, timeout=TIMEOUT, retry=JOB_RETRY)
async def tick(ctx: Context, input: Flaky) -> JobReceipt:
    """Run by the schedule: its request id names the occurrence (``schedule:chaos-tick@…``)."""
    return await _job_work(ctx, "tick", input)


# Webhooks in ----------------------------------------------------------------------------------


@tools.tool(effect="write", idempotent=False, parallel_safe=True, timeout=TIMEOUT)
async def hook_charge(ctx: Context, input: Work) -> Receipt:
    """Run by a webhook in mode ``call``: its request id is the event id, its effect once per event."""
    return await _async_work(ctx, "hook_charge", input.ms)


@tools.tool(effect="write", idempotent=False, parallel_safe=True, timeout=TIMEOUT, retry=JOB_RETRY)
async def hook_job(ctx: Context, input: Flaky) -> JobReceipt:
    """Run by a webhook in mode ``job``: the job's request id is the event id."""
    return await _job_work(ctx, "hook_job", input)


# Streams without a request id -------------------------------------------------------------------


@tools.tool(effect="write", idempotent=True, parallel_safe=True, timeout=TIMEOUT)
def named(ctx: Context, input: Work) -> Receipt:
    """Called over SSE without a request id (``chaos.streams``): the check is about the id its
    stream names and the record of that id, so it keeps no ledger line (every other tool's line
    carries the request id the checks group by). It works in a thread, in steps of about
    ``NAMED_STEP_MS``, reporting its attempt as each step's progress message and never heeding
    ``ctx.cancelled``: a worker paused or cut off mid-work wakes with the thread going on, and its
    stream must never carry an attempt's progress after a later attempt's."""
    ms = input.ms if ctx.attempt == 1 else NAMED_LATER_MS
    steps = max(1, ms // NAMED_STEP_MS)
    for step in range(steps):
        ctx.progress(step + 1, total=steps, message=str(ctx.attempt))
        time.sleep(ms / 1000 / steps)
    return Receipt(pid=os.getpid())


tools.schedule(TICK, cron="* * * * * *", tool="tick", arguments={"ms": 10}, grace=TICK_GRACE_S)

# What the checker needs to know of each tool, without asking the API.
IDEMPOTENT = {tool.name: tool.spec.idempotent for tool in tools}
EXCLUSIVE = {tool.name for tool in tools if not tool.spec.parallel_safe}
JOB_TOOLS = {"job_put", "job_charge", "tick"}
HOOK_TOOLS = {"hook_charge", "hook_job"}
