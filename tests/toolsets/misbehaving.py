"""Tools with the bugs a worker must survive: each still ends its execution with exactly one
record, and the worker goes on serving. Every tool's timeout is short (``TIMEOUT``), so a call
that was never settled shows as a wait past it.

``ok`` is the well-behaved tool a test calls afterwards; ``flood`` and ``big`` are heavy rather
than buggy (a tight progress loop, a large result)."""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
from typing import Any

import msgspec

from carmy_worker import Context, Toolbox, ToolError

tools = Toolbox()
TIMEOUT = 2.0
SECRET = "secret-in-the-tools-own-text"
MIB = 1024 * 1024


class Empty(msgspec.Struct):
    pass


class Count(msgspec.Struct):
    n: int


class Measure(msgspec.Struct):
    value: float


class Unprintable(Exception):
    """An exception whose text cannot be read: ``str`` and ``repr`` raise."""

    def __str__(self) -> str:
        raise RuntimeError(SECRET)

    def __repr__(self) -> str:
        raise RuntimeError(SECRET)


class Opaque:
    """Not JSON, and its repr raises: nothing may try to print it for the caller."""

    def __repr__(self) -> str:
        raise RuntimeError(SECRET)


class Boom(BaseException):
    """A tool's own BaseException subclass."""


class Treacherous(datetime.tzinfo):
    """Encoding a datetime asks its tzinfo for the offset: this one raises KeyboardInterrupt,
    from inside the worker's own encoding of the result, past every net but the last."""

    def utcoffset(self, dt: datetime.datetime | None) -> datetime.timedelta:
        raise KeyboardInterrupt(SECRET)

    def dst(self, dt: datetime.datetime | None) -> datetime.timedelta:
        return datetime.timedelta(0)


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def spec(**kwargs: Any) -> Any:
    return tools.tool(effect="none", timeout=TIMEOUT, **kwargs)


@spec(idempotent=True, parallel_safe=True)
async def ok(ctx: Context) -> Count:
    """Behaves."""
    return Count(n=1)


# --- what it raises ---------------------------------------------------------------------------


@spec()
async def unencodable_details(ctx: Context) -> Empty:
    """A ToolError whose details are not JSON, and whose repr raises."""
    raise ToolError("NOPE", "Refused, with details nobody can encode.", category="conflict", details=Opaque())


@spec()
async def deep_details(ctx: Context) -> Empty:
    """A ToolError whose details are nested past any encoder's depth."""
    raise ToolError("NOPE", "Refused, with very deep details.", category="conflict", details=nested(100_000))


@spec()
async def huge_details(ctx: Context) -> Empty:
    """A ToolError whose details are 2 MiB."""
    raise ToolError("NOPE", "Refused, with huge details.", category="conflict", details="x" * (2 * MIB))


@spec()
async def odd_tool_error(ctx: Context) -> Empty:
    """A ToolError with fields of the wrong types: an exception as message, a float retry_after."""
    raise ToolError("NOPE", ValueError("out of stock"), retry_after=1.5, retryable=True)  # type: ignore[arg-type]


@spec()
async def unprintable_message(ctx: Context) -> Empty:
    """A ToolError whose message cannot even be made text."""
    raise ToolError("NOPE", Unprintable())  # type: ignore[arg-type]


@spec()
async def unprintable(ctx: Context) -> Empty:
    """An exception whose str and repr raise."""
    raise Unprintable


@spec()
def unprintable_sync(ctx: Context) -> Empty:
    """An exception whose str and repr raise, from a thread."""
    raise Unprintable


@spec()
async def keyboard_interrupt(ctx: Context) -> Empty:
    """KeyboardInterrupt from a coroutine."""
    raise KeyboardInterrupt(SECRET)


@spec()
async def generator_exit(ctx: Context) -> Empty:
    """GeneratorExit from a coroutine."""
    raise GeneratorExit(SECRET)


@spec()
async def system_exit(ctx: Context) -> Empty:
    """sys.exit from a coroutine."""
    raise SystemExit(SECRET)


@spec()
async def base_exception(ctx: Context) -> Empty:
    """The tool's own BaseException subclass, from a coroutine."""
    raise Boom(SECRET)


@spec()
async def exit_in_a_helper(ctx: Context) -> Empty:
    """sys.exit in a helper awaited through asyncio.wait_for, which runs it as a task of its own."""

    async def helper() -> None:
        raise SystemExit(SECRET)

    await asyncio.wait_for(helper(), TIMEOUT)
    return Empty()


@spec()
async def interrupt_in_gather(ctx: Context) -> Empty:
    """KeyboardInterrupt in one of asyncio.gather's tasks."""

    async def helper() -> None:
        raise KeyboardInterrupt(SECRET)

    await asyncio.gather(asyncio.sleep(0), helper())
    return Empty()


@spec()
def keyboard_interrupt_sync(ctx: Context) -> Empty:
    """KeyboardInterrupt from a thread."""
    raise KeyboardInterrupt(SECRET)


@spec()
def stop_iteration_sync(ctx: Context) -> Empty:
    """StopIteration from a thread: asyncio cannot carry it out of the thread's future."""
    raise StopIteration(SECRET)


# --- what it returns --------------------------------------------------------------------------


@spec()
async def deep_output(ctx: Context) -> Any:
    """A result nested past any encoder's depth."""
    return nested(100_000)


@spec()
async def huge_output(ctx: Context) -> str:
    """A result over the worker's CARMY_MAX_RESULT_BYTES (1 MiB by default)."""
    return "x" * (MIB + 100)


@spec()
async def nan_output(ctx: Context) -> Measure:
    """NaN where a float is due: JSON has no NaN, and null is no float."""
    return Measure(value=float("nan"))


@spec()
async def nan_anything(ctx: Context) -> Any:
    """NaN where anything goes: it becomes null, as in JavaScript's JSON.stringify."""
    return {"value": float("nan")}


@spec()
async def opaque_output(ctx: Context) -> Any:
    """A result that is not JSON, whose repr raises."""
    return Opaque()


@spec()
async def treacherous_output(ctx: Context) -> Any:
    """A result whose encoding raises KeyboardInterrupt inside the worker."""
    return datetime.datetime(2024, 1, 1, tzinfo=Treacherous())


# --- what it reports --------------------------------------------------------------------------


@spec()
async def bad_partial(ctx: Context) -> Empty:
    """A partial result that is not JSON, not caught: the tool fails."""
    ctx.partial(Opaque())
    return Empty()


class Refusals(msgspec.Struct):
    errors: list[str]


@spec()
def careful_reports(ctx: Context) -> Refusals:
    """Reports values that cannot be sent, catching each error, and returns their messages."""
    errors = []
    for report in (lambda: ctx.partial("x" * MIB), lambda: ctx.partial(nested(100_000)),
                   lambda: ctx.partial(Opaque()), lambda: ctx.progress(float("nan")),
                   lambda: ctx.progress("half")):  # type: ignore[arg-type]
        try:
            report()
        except (TypeError, ValueError) as exc:
            errors.append(str(exc))
    ctx.progress(1, total=1)
    return Refusals(errors)


@spec()
def spawns_threads(ctx: Context) -> Count:
    """Starts threads that outlive it (one reports progress for a while, one raises), and returns."""

    def chatter() -> None:
        for i in range(50):
            ctx.progress(i)
            time.sleep(0.01)

    def crash() -> None:
        raise RuntimeError(SECRET)

    for target in (chatter, crash):
        threading.Thread(target=target, daemon=True).start()
    return Count(n=2)


class FloodInput(msgspec.Struct):
    n: int = 200_000


@tools.tool(effect="none", idempotent=True, parallel_safe=True, timeout=30)
async def flood(ctx: Context, input: FloodInput) -> Count:
    """Reports progress n times in a tight loop, never yielding to the event loop."""
    for i in range(1, input.n + 1):
        ctx.progress(i, total=input.n)
    return Count(n=input.n)


@tools.tool(effect="none", idempotent=True, parallel_safe=True, timeout=30)
def flood_sync(ctx: Context, input: FloodInput) -> Count:
    """Reports progress n times in a tight loop, from a thread."""
    for i in range(1, input.n + 1):
        ctx.progress(i, total=input.n)
    return Count(n=input.n)


class Ticks(msgspec.Struct):
    n: int = 20
    every: float = 0.05


@tools.tool(effect="none", idempotent=True, parallel_safe=True, timeout=30)
async def ticks(ctx: Context, input: Ticks) -> Count:
    """Reports progress n times, ``every`` seconds apart."""
    for i in range(1, input.n + 1):
        ctx.progress(i, total=input.n)
        await asyncio.sleep(input.every)
    return Count(n=input.n)


class BigInput(msgspec.Struct):
    size: int = 900 * 1024


@tools.tool(effect="none", parallel_safe=True, timeout=30)
async def big(ctx: Context, input: BigInput) -> str:
    """Returns ``size`` bytes of text."""
    return "b" * input.size


# --- what it leaves running -------------------------------------------------------------------


@spec()
def never_returns_sync(ctx: Context) -> Empty:
    """Never returns, deaf to ``ctx.cancelled``: its thread outlives its call, and its worker's drain."""
    threading.Event().wait()
    return Empty()


@spec()
def leaves_a_thread(ctx: Context) -> Empty:
    """Starts a thread (not a daemon) that never ends, and returns."""
    threading.Thread(target=threading.Event().wait, name="left-by-a-tool").start()
    return Empty()


_strays: set[asyncio.Task[None]] = set()


@spec()
async def leaves_a_task_that_exits(ctx: Context) -> Empty:
    """Starts a task that calls sys.exit a moment after the tool returned."""

    async def later() -> None:
        await asyncio.sleep(0.2)
        raise SystemExit(3)

    task = asyncio.get_running_loop().create_task(later())
    _strays.add(task)
    task.add_done_callback(_strays.discard)
    return Empty()
