"""Running one tool call under its timeout, turning every way it can end into data."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Generator
from concurrent.futures import Executor
from contextvars import ContextVar
from typing import Any

import msgspec
from msgspec import Struct

from carmy_worker.loop import Signal, first_done, running_loop
from carmy_worker.runtime import results
from carmy_worker.sdk.context import Context
from carmy_worker.sdk.errors import ToolError, error
from carmy_worker.sdk.toolbox import Tool
from carmy_worker.store import records
from carmy_worker.wire import ErrorBody

log = logging.getLogger("carmy.worker")

# Asked before each step of an async tool: True (take it), False (the tool gets CancelledError
# instead), or an awaitable to wait for first (a check under way), after which it is asked again.
# Not one already done: the step would ask again at once, and the event loop would not turn.
MayStep = Callable[[], bool | Awaitable[None]]

# How long an async tool that was cancelled (a cancel, a timeout) may take to stop before its
# outcome is recorded anyway. Its ``except CancelledError`` and ``finally`` blocks run first, so
# whoever is answered may count on them having run; one that ignores the cancellation, or
# cleans up slowly, delays its answer by this much at most.
STOP_GRACE = 1.0

# True in an async tool's task, and so in every task it starts (a task copies its creator's context).
_IN_TOOL: ContextVar[bool] = ContextVar("carmy_in_tool", default=False)


class Outcome(Struct, kw_only=True):
    """How a call ended: ``data`` (validated output as JSON), or ``error``, or a flag."""

    data: bytes | None = None
    error: ErrorBody | None = None
    timed_out: bool = False
    cancelled: bool = False


class Escaped(Exception):
    """What a tool raised that asyncio cannot carry. From an async tool, a ``BaseException``
    other than cancellation (``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit``, one of
    the tool's own): asyncio re-raises those out of the event loop, ending the worker. From a
    sync tool, ``StopIteration``: asyncio cannot set it on the call's future, which then never
    completes. Carried inside this one, they end only the tool's call. Its text is the class
    name only: the original's ``repr`` may raise (it is chained, for the log)."""


class _Stepwise:
    """Awaits an async tool's coroutine one step at a time, asking ``may_step()`` before each:
    a worker that was paused (stopped, frozen, starved) may have lost the execution meanwhile,
    and its tool must not take another step, not even one already due, before the worker knows.
    When ``may_step()`` says no, the tool gets ``CancelledError`` instead of its next step. When
    it answers with an awaitable (a check with Redis under way), the step waits for it, and
    ``may_step()`` is asked again: the event loop runs on meanwhile, and the tool takes no step.
    What stops the tool while it waits (a cancel, a timeout) reaches it as before, unchecked."""

    def __init__(self, coro: Coroutine[Any, Any, Any], may_step: MayStep) -> None:
        self._coro = coro
        self._may_step = may_step

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self._coro
        value: Any = None
        error: BaseException | None = None
        while True:
            if error is None:
                allowed = self._may_step()
                while not isinstance(allowed, bool):
                    try:
                        yield from allowed.__await__()
                    except GeneratorExit:
                        coro.close()
                        raise
                    except BaseException as exc:
                        error = exc
                        break
                    allowed = self._may_step()
                if error is None and not allowed:
                    error = asyncio.CancelledError()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                value = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                error = exc


def contain_tool_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Have ``loop`` contain the tasks async tools start (``asyncio.gather``, ``wait_for``, their
    own ``create_task``) as it contains the tools: a ``BaseException`` one raises (``sys.exit``
    in a helper) reaches whoever awaits the task as ``Escaped``; asyncio would re-raise it out of
    the event loop, ending the worker and every execution it runs. One nobody awaits is logged
    by asyncio ("Task exception was never retrieved")."""
    loop.set_task_factory(_task)


def _task(loop: asyncio.AbstractEventLoop, coro: Any, /, **kwargs: Any) -> asyncio.Task[Any]:
    """The loop's task factory (``context=`` among ``kwargs``), called in the creator's context."""
    return asyncio.Task(_escaping(coro) if _IN_TOOL.get() else coro, loop=loop, **kwargs)


async def _escaping(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await coro
    except (asyncio.CancelledError, Exception):
        raise
    except BaseException as exc:
        raise Escaped(type(exc).__name__) from exc


async def _contained(fn: Callable[..., Coroutine[Any, Any, Any]], args: tuple[Any, ...],
                     may_step: MayStep | None, ended: asyncio.Future[None]) -> Any:
    # The tool's coroutine is made here, in its task's first step: a call cancelled before that
    # step leaves no coroutine behind that was never awaited.
    _IN_TOOL.set(True)  # in this task's own context: for the tasks the tool starts
    try:
        call = fn(*args)
        return await (call if may_step is None else _Stepwise(call, may_step))
    except (asyncio.CancelledError, Exception):
        raise
    except BaseException as exc:
        raise Escaped(type(exc).__name__) from exc
    finally:
        # The task ends with this step: whoever waits for it (``invoke``) is woken now, a turn
        # of the loop before the task's own done callbacks would run.
        if not ended.done():
            ended.set_result(None)


def _contained_sync(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except StopIteration as exc:
        raise Escaped(type(exc).__name__) from exc


def decode_input(tool: Tool, arguments: bytes) -> Any:
    """The tool's input value; raises ``msgspec.ValidationError`` on bad arguments."""
    if tool.input_decoder is None:
        if msgspec.json.decode(arguments) != {}:
            raise msgspec.ValidationError("this tool takes no arguments")
        return None
    return tool.input_decoder.decode(arguments)


class Decoded(Struct, frozen=True):
    """A call's arguments, decoded for its tool (``decode``) before anything was taken for it."""

    value: Any


def decode(tool: Tool, arguments: bytes) -> Decoded | Outcome:
    """``arguments`` decoded for ``tool``, or the ``INVALID_ARGUMENTS`` outcome that refuses
    them. A caller decodes before it takes anything for the call (a tool's lock, BEGIN's mark):
    arguments the tool would never get have nothing to wait for."""
    try:
        return Decoded(decode_input(tool, arguments))
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return Outcome(error=error(
            "INVALID_ARGUMENTS", f"The arguments do not match the input schema: {exc}", details={"reason": str(exc)}
        ))


async def invoke(
    tool: Tool, ctx: Context, arguments: bytes | Decoded, *, timeout: float, executor: Executor,
    cancelled: Signal, max_result_bytes: int, on_end: Callable[[], object] | None = None,
    may_step: MayStep | None = None,
) -> Outcome:
    """Run ``tool`` once with ``arguments`` (JSON, or ``Decoded`` already). Returns when it
    finished, timed out, or ``cancelled`` was set.

    A sync tool runs in ``executor``; on timeout or cancellation the caller is answered at once
    and the thread is left to finish on its own (a thread cannot be killed), with
    ``ctx.cancelled`` telling it to stop; an async tool is waited for until it has stopped, at most
    ``STOP_GRACE`` seconds. ``on_end`` is called when the call has really ended,
    which for such a thread may be after ``invoke`` returned. A result, or a ``ToolError``'s
    details, over ``max_result_bytes`` of JSON is not recorded (``runtime.results``). An async
    tool asks ``may_step()`` before each step it takes, and waits for what it answers if that
    is an awaitable (``_Stepwise``).
    """
    decoded = decode(tool, arguments) if isinstance(arguments, bytes) else arguments
    if isinstance(decoded, Outcome):
        return _ended_unstarted(decoded, on_end)
    args = (ctx,) if tool.input_decoder is None else (ctx, decoded.value)
    if timeout <= 0:
        return _ended_unstarted(Outcome(timed_out=True), on_end)
    loop = running_loop()
    ended: asyncio.Future[None] | None = None  # set by an async tool's task as it ends
    if tool.is_async:
        ended = loop.create_future()
        call: asyncio.Future[Any] = loop.create_task(_contained(tool.fn, args, may_step, ended))
    else:  # a thread's end reaches the loop as a callback of its own, in no set order: not ``ended``
        call = loop.run_in_executor(executor, _contained_sync, tool.fn, *args)
    ctx._start(call)
    if on_end is not None:
        call.add_done_callback(lambda _: on_end())
    try:
        await first_done(call, timeout=timeout, signal=cancelled, woken=ended)
    except asyncio.CancelledError:  # the worker itself is stopping: let arq know
        ctx._cancel()
        raise
    if not call.done():
        ctx._cancel()
        if tool.is_async:
            await first_done(call, timeout=STOP_GRACE)
        return Outcome(cancelled=True) if cancelled.is_set() else Outcome(timed_out=True)
    return _finish(tool, ctx, call, max_result_bytes)


def _ended_unstarted(outcome: Outcome, on_end: Callable[[], object] | None) -> Outcome:
    """``outcome`` of a call whose tool never started: it has ended, so ``on_end`` is called now.
    A tool lock taken for it (``on_end`` releases it) would otherwise be renewed for ever, and
    every later call of the tool time out waiting for it."""
    if on_end is not None:
        on_end()
    return outcome


def _finish(tool: Tool, ctx: Context, call: asyncio.Future[Any], limit: int) -> Outcome:
    exec_id = ctx.execution_id
    try:
        result = call.result()
    except ToolError as exc:
        return Outcome(error=results.tool_error(exc, limit=limit, tool=tool.name, exec_id=exec_id))
    except asyncio.CancelledError:
        # The tool cancelled itself, or something it awaited was cancelled under it (a stop of
        # ours has not come: it would have been answered before the call was done).
        return Outcome(cancelled=True)
    except BaseException:  # SystemExit from a sync tool's thread, Escaped from an async one: never the worker's end
        log.exception("tool %s raised (execution %s)", tool.name, exec_id)
        return Outcome(error=records.panic_error())
    data = results.output(tool, result, limit=limit, exec_id=exec_id)
    return Outcome(error=data) if isinstance(data, ErrorBody) else Outcome(data=data)
