"""Running one tool call under its timeout, turning every way it can end into data."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any

import msgspec
from msgspec import Struct

from carmy_worker.sdk.context import Context
from carmy_worker.sdk.errors import MAY_HAVE_COMMITTED, ToolError, error
from carmy_worker.sdk.toolbox import Tool
from carmy_worker.wire import ErrorBody, json_encoder

log = logging.getLogger("carmy.worker")


class Outcome(Struct, kw_only=True):
    """How a call ended: ``data`` (validated output as JSON), or ``error``, or a flag."""

    data: bytes | None = None
    error: ErrorBody | None = None
    timed_out: bool = False
    cancelled: bool = False


class Escaped(Exception):
    """A ``BaseException`` other than cancellation (``SystemExit``, ``KeyboardInterrupt``,
    ``GeneratorExit``) raised by an async tool. asyncio re-raises those out of the event loop,
    ending the worker; carried inside this one they end only the tool's own task."""


async def _contained(call: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await call
    except (asyncio.CancelledError, Exception):
        raise
    except BaseException as exc:
        raise Escaped(repr(exc)) from exc


def decode_input(tool: Tool, arguments: bytes) -> Any:
    """The tool's input value; raises ``msgspec.ValidationError`` on bad arguments."""
    if tool.input_decoder is None:
        if msgspec.json.decode(arguments) != {}:
            raise msgspec.ValidationError("this tool takes no arguments")
        return None
    return tool.input_decoder.decode(arguments)


async def invoke(
    tool: Tool, ctx: Context, arguments: bytes, *, timeout: float, executor: Executor,
    cancelled: asyncio.Event, on_end: Callable[[], object] | None = None,
) -> Outcome:
    """Run ``tool`` once. Returns when it finished, timed out, or ``cancelled`` was set.

    A sync tool runs in ``executor``; on timeout or cancellation the caller is answered at once
    and the thread is left to finish on its own (a thread cannot be killed), with
    ``ctx.cancelled`` telling it to stop. ``on_end`` is called when the call has really ended,
    which for such a thread may be after ``invoke`` returned.
    """
    try:
        value = decode_input(tool, arguments)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return Outcome(error=error(
            "INVALID_ARGUMENTS", f"The arguments do not match the input schema: {exc}", details={"reason": str(exc)}
        ))
    args = (ctx,) if tool.input_decoder is None else (ctx, value)
    if timeout <= 0:
        if on_end is not None:
            on_end()
        return Outcome(timed_out=True)
    if tool.is_async:
        call: asyncio.Future[Any] = asyncio.ensure_future(_contained(tool.fn(*args)))
    else:
        call = asyncio.get_running_loop().run_in_executor(executor, tool.fn, *args)
    if on_end is not None:
        call.add_done_callback(lambda _: on_end())
    stop = asyncio.ensure_future(cancelled.wait())
    try:
        await asyncio.wait((call, stop), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the worker itself is stopping: let arq know
        ctx._cancel()
        call.cancel()
        raise
    finally:
        stop.cancel()
    if not call.done():
        ctx._cancel()
        call.cancel()
        return Outcome(cancelled=True) if cancelled.is_set() else Outcome(timed_out=True)
    return _finish(tool, ctx, call)


def _finish(tool: Tool, ctx: Context, call: asyncio.Future[Any]) -> Outcome:
    try:
        result = call.result()
    except ToolError as exc:
        return Outcome(error=exc.to_wire())
    except asyncio.CancelledError:
        # The tool cancelled itself (or swallowed our cancel and re-raised late).
        return Outcome(cancelled=True)
    except BaseException:  # SystemExit from a sync tool's thread, Escaped from an async one: never the worker's end
        log.exception("tool %s raised (execution %s)", tool.name, ctx.execution_id)
        return Outcome(error=error(
            "TOOL_PANIC", f"The tool failed with an unexpected error. {MAY_HAVE_COMMITTED}"
        ))
    try:
        data = json_encoder.encode(result)
        tool.output_decoder.decode(data)
    except (TypeError, ValueError, msgspec.ValidationError, msgspec.EncodeError) as exc:
        log.error("tool %s returned an invalid output (execution %s): %s", tool.name, ctx.execution_id, exc)
        return Outcome(error=error(
            "INVALID_OUTPUT", f"The tool returned a value its output schema does not allow. {MAY_HAVE_COMMITTED}",
        ))
    return Outcome(data=data)
