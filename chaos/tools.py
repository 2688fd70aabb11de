"""The tools the chaos check's workers serve (``python -m carmy_worker chaos.tools``).

Each writes its side effect to the ledger (``chaos.ledger``), never to Redis: ``started``
before its work, ``effect`` at the moment the effect happens (the end of its body), or
``abandoned`` when it was cancelled first. The mix covers what the guarantees distinguish:
idempotent or not, async or sync (a thread), and one tool that is not ``parallel_safe``.
"""

from __future__ import annotations

import asyncio
import os
import time

import msgspec

from carmy_worker import Context, Toolbox, ToolError
from chaos.ledger import Ledger

tools = Toolbox()
ledger = Ledger()
TIMEOUT = 10.0  # seconds, for every tool: far above their work, so a timeout means trouble


class Work(msgspec.Struct):
    ms: int  # how long the work takes before its effect


class Receipt(msgspec.Struct):
    """What every tool returns: which process did the effect, so that an answer recorded by
    one run and replaced by another would differ."""

    pid: int


async def _async_work(ctx: Context, tool: str, ms: int) -> Receipt:
    ledger.write("started", ctx, tool)
    try:
        await asyncio.sleep(ms / 1000)
    except asyncio.CancelledError:
        ledger.write("abandoned", ctx, tool)
        raise
    ledger.write("effect", ctx, tool)
    return Receipt(pid=os.getpid())


def _sync_work(ctx: Context, tool: str, ms: int, careful: bool) -> Receipt:
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
    return Receipt(pid=os.getpid())


@tools.tool(effect="write", idempotent=False, parallel_safe=True, timeout=TIMEOUT)
async def charge(ctx: Context, input: Work) -> Receipt:
    """Not idempotent (async): its effect must never happen twice for one request."""
    return await _async_work(ctx, "charge", input.ms)


@tools.tool(effect="write", idempotent=False, parallel_safe=True, timeout=TIMEOUT)
def charge_sync(ctx: Context, input: Work) -> Receipt:
    """Not idempotent (sync, in a thread): its effect must never happen twice for one request."""
    return _sync_work(ctx, "charge_sync", input.ms, careful=True)


@tools.tool(effect="write", idempotent=True, parallel_safe=True, timeout=TIMEOUT)
async def put(ctx: Context, input: Work) -> Receipt:
    """Idempotent (async): may be run again after its worker died."""
    return await _async_work(ctx, "put", input.ms)


@tools.tool(effect="write", idempotent=True, parallel_safe=True, timeout=TIMEOUT)
def put_sync(ctx: Context, input: Work) -> Receipt:
    """Idempotent (sync, in a thread): may be run again after its worker died."""
    return _sync_work(ctx, "put_sync", input.ms, careful=False)


@tools.tool(effect="write", idempotent=False, parallel_safe=False, timeout=TIMEOUT)
async def serial(ctx: Context, input: Work) -> Receipt:
    """Not idempotent and not parallel-safe: two runs must never overlap, across all workers."""
    return await _async_work(ctx, "serial", input.ms)


# What the checker needs to know of each tool, without asking the API.
IDEMPOTENT = {tool.name: tool.spec.idempotent for tool in tools}
EXCLUSIVE = {tool.name for tool in tools if not tool.spec.parallel_safe}
