"""Tools for the jobs tests, run in real worker processes. Every run appends a line to a file of
``CARMY_TEST_DIR`` named after the tool and the caller's ``name``: a count outside Redis of how
many times a job's tool really ran, and with which request id (``ctx.request_id``)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import msgspec

from carmy_worker import Context, RetryPolicy, Toolbox, ToolError

tools = Toolbox()
OUT = Path(os.environ.get("CARMY_TEST_DIR", "/tmp"))
# Fast retries, so that a test sees several attempts in a second or two.
FAST = RetryPolicy(max_attempts=3, backoff=0.2, max_backoff=1.0)


class Work(msgspec.Struct):
    name: str
    fail_times: int = 0  # attempts that fail (retryably) before one succeeds
    seconds: float = 0.0  # how long each run takes


class Done(msgspec.Struct):
    name: str
    run: int  # which run of this name it was (1 for the first)
    at_ms: int  # when it began (unix ms)


def record_run(tool: str, ctx: Context, work: Work, began: int | None = None) -> int:
    """Append this run (when it ``began``, unix ms, now by default; its request id) to
    ``{tool}-{name}``; its number."""
    path = OUT / f"{tool}-{work.name}"
    with path.open("a") as f:
        f.write(f"{int(time.time() * 1000) if began is None else began} {ctx.request_id}\n")
    return len(path.read_text().splitlines())


async def run(tool: str, ctx: Context, work: Work) -> Done:
    began = int(time.time() * 1000)
    n = record_run(tool, ctx, work, began)  # one reading of the clock: the file and the result agree
    if work.seconds:
        await asyncio.sleep(work.seconds)
    if n <= work.fail_times:
        raise ToolError("UPSTREAM_BUSY", f"run {n} failed on purpose", category="capacity", retryable=True)
    return Done(work.name, n, began)


@tools.tool(effect="write", idempotent=True, parallel_safe=True, retry=FAST)
async def flaky(ctx: Context, work: Work) -> Done:
    """Fails retryably its first ``fail_times`` runs for a name, then succeeds."""
    return await run("flaky", ctx, work)


@tools.tool(effect="write", idempotent=False, parallel_safe=True, retry=FAST)
async def flaky_once(ctx: Context, work: Work) -> Done:
    """Not idempotent; fails retryably its first ``fail_times`` runs for a name, then succeeds."""
    return await run("flaky-once", ctx, work)


@tools.tool(effect="write", idempotent=False, parallel_safe=True, retry=FAST)
async def refuse(ctx: Context, work: Work) -> Done:
    """Fails for good: its error says it is not retryable."""
    record_run("refuse", ctx, work)
    raise ToolError("BAD_INPUT", "this job can never succeed", category="validation")


@tools.tool(effect="external_write", idempotent=False, parallel_safe=True, retry=FAST, timeout=30)
async def charge(ctx: Context, work: Work) -> Done:
    """Not idempotent, and slow: a worker killed while it runs leaves its outcome uncertain."""
    return await run("charge", ctx, work)


@tools.tool(effect="write", idempotent=True, parallel_safe=True, retry=FAST, timeout=30)
async def sync_mirror(ctx: Context, work: Work) -> Done:
    """Idempotent, and slow: a worker killed while it runs makes the job try it again."""
    return await run("sync-mirror", ctx, work)


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def stamp(ctx: Context, work: Work) -> Done:
    """Records when it ran: for jobs that must not start before their run_at."""
    return await run("stamp", ctx, work)
