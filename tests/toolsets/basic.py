"""Tools the tests run in real worker processes. Side effects that tests count are written to
files (``CARMY_TEST_DIR``), outside Redis."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import msgspec

from carmy_worker import Context, Toolbox, ToolError

tools = Toolbox()
OUT = Path(os.environ.get("CARMY_TEST_DIR", "/tmp"))


def mark(name: str, line: str = "x") -> None:
    """Append a line to a file the test reads: proof that something ran, counted outside Redis."""
    with (OUT / name).open("a") as f:
        f.write(line + "\n")


class Empty(msgspec.Struct):
    pass


class EchoInput(msgspec.Struct):
    text: str
    times: int = 1


class EchoOutput(msgspec.Struct):
    text: str


class SleepInput(msgspec.Struct):
    seconds: float
    tag: str = ""


class Count(msgspec.Struct):
    n: int


class Node(msgspec.Struct):
    """A recursive input type: a tree."""

    value: int
    children: list[Node] = []


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def noop(ctx: Context) -> Empty:
    """Does nothing."""
    return Empty()


@tools.tool(effect="read", idempotent=True, parallel_safe=True)
async def echo(ctx: Context, input: EchoInput) -> EchoOutput:
    """Echo the text."""
    return EchoOutput(text=input.text * input.times)


@tools.tool(effect="read", idempotent=True, parallel_safe=True, title="Split into words")
async def words(ctx: Context, input: EchoInput) -> list[str]:
    """Split the text into words: a list, not an object."""
    return input.text.split() * input.times


@tools.tool(effect="read", idempotent=True, parallel_safe=True)
def echo_sync(ctx: Context, input: EchoInput) -> EchoOutput:
    """Echo the text from a thread."""
    return EchoOutput(text=input.text * input.times)


@tools.tool(effect="none", idempotent=True, parallel_safe=True, timeout=1)
async def sleepy(ctx: Context, input: SleepInput) -> Empty:
    """Sleep (async), noting start, end and cancellation in files."""
    mark(f"sleepy-start-{input.tag}", str(time.time()))
    try:
        await asyncio.sleep(input.seconds)
    except asyncio.CancelledError:
        mark(f"sleepy-cancelled-{input.tag}", str(time.time()))
        raise
    mark(f"sleepy-end-{input.tag}", str(time.time()))
    return Empty()


@tools.tool(effect="none", idempotent=True, parallel_safe=True, timeout=0.5)
def sleepy_sync(ctx: Context, input: SleepInput) -> Empty:
    """Sleep in a thread; the timeout must still answer on time."""
    time.sleep(input.seconds)
    mark(f"sleepy-sync-end-{input.tag}")
    return Empty()


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def progress(ctx: Context, input: Count) -> Count:
    """Report progress n times, then a partial result."""
    for i in range(input.n):
        ctx.progress(i + 1, total=input.n, message=f"step {i + 1}")
    ctx.partial({"so_far": input.n})
    return Count(n=input.n)


class FloodInput(msgspec.Struct):
    n: int
    size: int = 200
    tag: str = ""


@tools.tool(effect="none", idempotent=True, parallel_safe=True, timeout=300)
async def flood(ctx: Context, input: FloodInput) -> Count:
    """Report progress n times as fast as it can, each with a message of ``size`` characters,
    noting in a file when it has reported them all."""
    message = "p" * input.size
    for i in range(input.n):
        ctx.progress(i + 1, total=input.n, message=message)
        if i % 100 == 99:
            await asyncio.sleep(0)  # let the events go out as they come
    mark(f"flood-end-{input.tag}")
    return Count(n=input.n)


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
def progress_sync(ctx: Context, input: Count) -> Count:
    """Report progress n times from a thread."""
    for i in range(input.n):
        ctx.progress(i + 1, total=input.n)
    return Count(n=input.n)


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def tree_size(ctx: Context, input: Node) -> Count:
    """Count the nodes of a tree (a recursive input type)."""
    n, todo = 0, [input]
    while todo:
        node = todo.pop()
        n += 1
        todo.extend(node.children)
    return Count(n=n)


class Leaf(msgspec.Struct, tag="leaf"):
    value: int


class Branch(msgspec.Struct, tag="branch"):
    children: list[Branch | Leaf] = []


class Tree(msgspec.Struct):
    """A recursive union input type: a tree of branches and leaves, told apart by their tag."""

    root: Branch | Leaf


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def leaf_sum(ctx: Context, input: Tree) -> Count:
    """Add up the values of a tree's leaves (a recursive union input type)."""
    total, todo = 0, [input.root]
    while todo:
        node = todo.pop()
        if isinstance(node, Leaf):
            total += node.value
        else:
            todo.extend(node.children)
    return Count(n=total)


@tools.tool(effect="none")
async def explode(ctx: Context) -> Empty:
    """Raise an unexpected error with a secret in its text."""
    raise RuntimeError("secret-database-password-hunter2")


@tools.tool(effect="none")
async def refuse(ctx: Context) -> Empty:
    """Fail with a structured ToolError."""
    raise ToolError("OUT_OF_STOCK", "Nothing left.", category="conflict", retryable=True, retry_after=7,
                    suggested_action="wait", details={"sku": "KB-01"})


@tools.tool(effect="none")
async def bad_output(ctx: Context) -> Count:
    """Return something that is not a Count."""
    return Count(n="not a number")  # type: ignore[arg-type]


@tools.tool(effect="destructive", idempotent=True)
async def wipe(ctx: Context) -> Count:
    """Destructive: needs confirm:wipe."""
    return Count(n=0)


@tools.tool(effect="write", confirmation="required")
async def publish(ctx: Context) -> Count:
    """Needs confirmation although not destructive."""
    return Count(n=1)


class WhoAmI(msgspec.Struct):
    principal: str | None
    session: str | None
    permissions: list[str]
    request_id: str | None


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def whoami(ctx: Context) -> WhoAmI:
    """Return the trusted context the tool saw."""
    return WhoAmI(ctx.principal, ctx.session, sorted(ctx.permissions), ctx.request_id)


class AnyInput(msgspec.Struct):
    value: Any = None


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def anything(ctx: Context, input: AnyInput) -> AnyInput:
    """Echo any JSON value."""
    return input


class TallyInput(msgspec.Struct):
    name: str
    seconds: float = 0.0


@tools.tool(effect="write", timeout=10)
async def tally(ctx: Context, input: TallyInput) -> Count:
    """Not idempotent: appends a line to a file (the side effect), then sleeps."""
    mark(f"tally-{input.name}", ctx.execution_id)
    await asyncio.sleep(input.seconds)
    mark(f"tally-done-{input.name}", f"{ctx.execution_id} {ctx.attempt}")  # the step after the sleep
    return Count(n=len((OUT / f"tally-{input.name}").read_text().splitlines()))


@tools.tool(effect="write", idempotent=True, timeout=10)
async def tally_idem(ctx: Context, input: TallyInput) -> Count:
    """Idempotent by declaration: may be run again after a crash."""
    mark(f"tally-idem-{input.name}", ctx.execution_id)
    await asyncio.sleep(input.seconds)
    mark(f"tally-idem-done-{input.name}", f"{ctx.execution_id} {ctx.attempt}")
    return Count(n=len((OUT / f"tally-idem-{input.name}").read_text().splitlines()))


class ReportInput(msgspec.Struct):
    steps: int = 150


@tools.tool(effect="none", idempotent=True, timeout=30)
def report_attempt(ctx: Context, input: ReportInput) -> Count:
    """Idempotent, sync: reports progress naming its attempt every 20 ms, ``steps`` times, and
    never heeds ``ctx.cancelled``: a thread that goes on after its attempt lost the execution."""
    for i in range(input.steps):
        ctx.progress(i + 1, total=input.steps, message=f"attempt {ctx.attempt}")
        time.sleep(0.02)
    return Count(n=input.steps)


class ExclusiveInput(msgspec.Struct):
    seconds: float = 0.2


@tools.tool(effect="write", idempotent=True, parallel_safe=False, timeout=5)
async def exclusive(ctx: Context, input: ExclusiveInput) -> Empty:
    """Not parallel-safe: records its start and end times, which must never overlap."""
    start = time.time()
    await asyncio.sleep(input.seconds)
    mark("exclusive", f"{start} {time.time()}")
    return Empty()


@tools.tool(effect="none", idempotent=True, parallel_safe=True, timeout=30)
async def linger(ctx: Context, input: SleepInput) -> Empty:
    """Sleep up to 30 s, noting when it started and when it was cancelled (unix time)."""
    mark(f"linger-start-{input.tag}", str(time.time()))
    try:
        await asyncio.sleep(input.seconds)
    except asyncio.CancelledError:
        mark(f"linger-cancelled-{input.tag}", str(time.time()))
        raise
    return Empty()


@tools.tool(effect="none", parallel_safe=True, timeout=300)
async def hold(ctx: Context, input: SleepInput) -> Empty:
    """Wait until cancelled (or for ``seconds``, at most 300), noting each start and each
    cancellation (the execution id) in files."""
    mark(f"hold-start-{input.tag}", ctx.execution_id)
    try:
        await asyncio.sleep(input.seconds)
    except asyncio.CancelledError:
        mark(f"hold-cancelled-{input.tag}", ctx.execution_id)
        raise
    return Empty()


class NotifyInput(msgspec.Struct):
    to: str


@tools.tool(effect="external_write")
async def notify(ctx: Context, input: NotifyInput) -> Count:
    """Tell someone outside (an external write): appends a line to a file."""
    mark(f"notify-{input.to}", ctx.execution_id)
    return Count(n=1)


@tools.tool(effect="write", parallel_safe=False, timeout=20)
async def exclusive_slow(ctx: Context, input: SleepInput) -> Empty:
    """Not parallel-safe and not idempotent: notes when it started and in which process, then sleeps."""
    mark(f"exclusive-slow-start-{input.tag}", f"{time.time()} {os.getpid()}")
    await asyncio.sleep(input.seconds)
    return Empty()


class GateInput(msgspec.Struct):
    tag: str
    fail: bool = False


@tools.tool(effect="none", parallel_safe=True, timeout=30)
async def gate(ctx: Context, input: GateInput) -> Count:
    """Wait until the test opens the gate (a file ``gate-open-TAG``), then answer, or fail with a
    ToolError if ``fail``; notes its start and its cancellation (the execution id) in files."""
    mark(f"gate-start-{input.tag}", ctx.execution_id)
    ctx.progress(0, message="waiting at the gate")
    try:
        while not (OUT / f"gate-open-{input.tag}").exists():
            await asyncio.sleep(0.02)
    except asyncio.CancelledError:
        mark(f"gate-cancelled-{input.tag}", ctx.execution_id)
        raise
    if input.fail:
        raise ToolError("GATE_CLOSED", "The gate opened onto a wall.", category="conflict")
    return Count(n=1)


@tools.tool(effect="write", parallel_safe=False, timeout=30)
async def exclusive_gate(ctx: Context, input: GateInput) -> Count:
    """Not parallel-safe and not idempotent: notes its start (the execution id), then waits until
    the test opens its gate (a file ``gate-open-TAG``)."""
    mark(f"exclusive-gate-start-{input.tag}", ctx.execution_id)
    while not (OUT / f"gate-open-{input.tag}").exists():
        await asyncio.sleep(0.02)
    return Count(n=1)
