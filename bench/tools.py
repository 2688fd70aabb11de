"""The tools the benchmark runs, served by ``python -m carmy_worker bench.tools``.

The baselines in ``bench.baselines`` call the very same functions, so every scenario measures
the same work and differs only in how the call reaches it.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import msgspec

from carmy_worker import Context, Toolbox

tools = Toolbox()


class Empty(msgspec.Struct):
    pass


# parallel_safe=True: the default (False) would allow one execution at a time across all
# workers, which is a locking benchmark, not a throughput one.
@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def noop(ctx: Context) -> Empty:
    """Do nothing: measures the cost of the call itself."""
    return Empty()


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def sleep50(ctx: Context) -> Empty:
    """Sleep 50 ms: a tool whose time is spent waiting, for the scale-out curve."""
    await asyncio.sleep(0.05)
    return Empty()


@tools.tool(effect="none", idempotent=True, parallel_safe=True, timeout=10)
async def sleep2s(ctx: Context) -> Empty:
    """Sleep 2 s: keeps hundreds of executions in flight for the memory check."""
    await asyncio.sleep(2)
    return Empty()


class ForecastInput(msgspec.Struct):
    city: str
    units: str = "metric"
    days: int = 1
    include: list[str] = []


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def forecast(ctx: Context, input: ForecastInput) -> Empty:
    """Do nothing with a typical small arguments object: the jobs' memory row queues calls of it."""
    return Empty()


class LingerInput(msgspec.Struct):
    tag: str


@tools.tool(effect="none", idempotent=True, parallel_safe=True, timeout=30)
async def linger(ctx: Context, input: LingerInput) -> Empty:
    """Wait to be cancelled; note that it began, and the instant (unix time) CancelledError
    arrived, in files."""
    marks = Path(os.environ.get("BENCH_MARKS", "/tmp"))
    (marks / f"started-{input.tag}").touch()
    try:
        await asyncio.sleep(25)
    except asyncio.CancelledError:
        (marks / f"cancelled-{input.tag}").write_text(repr(time.time()))
        raise
    return Empty()


class LedgerInput(msgspec.Struct):
    request: str


class LedgerEntry(msgspec.Struct):
    request: str
    execution_id: str


@tools.tool(effect="write", parallel_safe=True, timeout=10)
async def ledger(ctx: Context, input: LedgerInput) -> LedgerEntry:
    """Not idempotent: each run appends a line to a file outside Redis (``bench.failover`` counts them)."""
    marks = Path(os.environ.get("BENCH_MARKS", "/tmp"))
    with (marks / "ledger").open("a") as f:
        f.write(f"{input.request} {ctx.execution_id}\n")
    await asyncio.sleep(0.02)
    return LedgerEntry(request=input.request, execution_id=ctx.execution_id)


class EchoInput(msgspec.Struct):
    data: str


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def echo(ctx: Context, input: EchoInput) -> EchoInput:
    """Return the arguments: the cost curve of arguments and results by size (bench/sizes.py)."""
    return input


class EmitInput(msgspec.Struct):
    events: int


@tools.tool(effect="none", idempotent=True, parallel_safe=True, timeout=60)
async def emit(ctx: Context, input: EmitInput) -> Empty:
    """Report progress ``events`` times, then end: the cost curve of progress events per execution."""
    for i in range(input.events):
        ctx.progress(i + 1, input.events)
    return Empty()


@tools.tool(effect="none", idempotent=True, parallel_safe=True, timeout=900)
async def idle(ctx: Context) -> Empty:
    """Sleep until cancelled (up to 15 min): keeps an SSE stream open and quiet."""
    await asyncio.sleep(890)
    return Empty()
