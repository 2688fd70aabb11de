"""What a tool knows about the call it serves: ``AgentContext`` (the trusted identity) and
``Context`` (that plus the execution, progress reporting and cancellation)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from msgspec import Struct

from carmy_worker.loop import running_loop, running_loop_or_none
from carmy_worker.sdk.errors import describe
from carmy_worker.wire import MAX_EVENT_BYTES, ProgressData


class AgentContext(Struct, frozen=True, kw_only=True):
    """The trusted identity of a call.

    Host middleware puts one into ``scope["carmy.context"]``; API keys produce one too. A
    request body can never set it.
    """

    principal: str | None = None
    session: str | None = None
    permissions: frozenset[str] = frozenset()
    metadata: dict[str, Any] = {}


_encode = msgspec.json.Encoder().encode


class Context:
    """Passed to every tool as its first argument.

    ``progress`` and ``partial`` are plain methods, safe to call from async tools and from
    sync tools running in a thread; events are delivered in call order, before
    ``tool.completed``. A value that cannot be sent (not JSON, or an event over
    ``MAX_EVENT_BYTES``) raises ``TypeError`` or ``ValueError`` in that call, where the tool's
    author sees it. Events are best effort: a tool that reports faster than they can be
    published has older ones dropped (``runtime.publisher``). ``cancelled`` turns true when the
    caller went away, the timeout passed or this worker lost the execution, so a sync tool can
    stop early; an async tool also gets ``CancelledError``.

    ``attempt`` is the fencing token of this run: it grows with every attempt at the execution,
    and only the current attempt's outcome is recorded. A system the tool changes can remember
    the highest ``(execution_id, attempt)`` it has seen and refuse lower ones, so a worker that
    was paused and lost its execution can never act after its successor.
    ``holds_execution()`` asks the store whether this attempt is still the current one.
    """

    def __init__(
        self,
        *,
        execution_id: str,
        tool: str,
        request_id: str | None,
        agent: AgentContext,
        emit: Callable[[bytes, bool], None],
        attempt: int = 1,
        holds: Callable[[], Awaitable[bool]] | None = None,
        trace_id: str | None = None,
    ) -> None:
        self.execution_id = execution_id
        # The execution's trace when tracing is on: each progress event names it.
        self.trace_id = trace_id
        self.attempt = attempt
        self.tool = tool
        self.request_id = request_id
        self.principal = agent.principal
        self.session = agent.session
        self.permissions = agent.permissions
        self.metadata = agent.metadata
        self._emit = emit  # (event as JSON, carries a partial result)
        # Read from a sync tool's thread, set on the loop: a flag is enough (nothing waits on
        # it), and a threading.Event per execution was a lock and a condition built every time.
        self._cancelled = False
        self._last_progress: float | int = 0
        self._holds = holds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._call: asyncio.Future[Any] | None = None  # the running call, stopped by _cancel

    async def holds_execution(self) -> bool:
        """Whether this attempt still holds its execution (one round trip to the store): False
        once it was cancelled, settled or handed to another attempt. Call it before a side effect
        that must not happen twice; pass ``attempt`` along where the other system can check it."""
        if self._cancelled:
            return False
        return True if self._holds is None else await self._holds()

    def holds_execution_blocking(self, timeout: float = 5.0) -> bool:
        """``holds_execution`` for a sync tool (it runs in a thread); False if the store does not
        answer within ``timeout`` seconds."""
        if self._loop is None or self._holds is None:
            return not self._cancelled
        if running_loop_or_none() is self._loop:
            raise RuntimeError("ctx.holds_execution_blocking() would block the event loop: "
                               "an async tool awaits ctx.holds_execution()")
        future = asyncio.run_coroutine_threadsafe(self.holds_execution(), self._loop)
        try:
            return future.result(timeout)
        except Exception:
            future.cancel()
            return False

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def progress(
        self, progress: float | int, total: float | int | None = None, message: str | None = None
    ) -> None:
        """Report how far the tool is; relayed as a ``tool.progress`` event. ``progress`` and
        ``total`` are finite numbers (MCP clients need them so), ``message`` text."""
        _check_number("progress", progress)
        if total is not None:
            _check_number("total", total)
        if message is not None and not isinstance(message, str):
            raise TypeError(f"ctx.progress: message must be a str, not {type(message).__name__}")
        self._send(ProgressData(
            execution_id=self.execution_id, tool=self.tool, progress=progress, total=total, message=message,
            trace_id=self.trace_id,
        ), partial=False)
        self._last_progress = progress

    def partial(self, value: Any) -> None:
        """Send a partial result (any JSON-encodable value) as a ``tool.progress`` event."""
        self._send(ProgressData(
            execution_id=self.execution_id, tool=self.tool, progress=self._last_progress, partial=value,
            trace_id=self.trace_id,
        ), partial=True)

    def _send(self, data: ProgressData, *, partial: bool) -> None:
        if self._cancelled:
            return
        # Encode here so a value that cannot be sent fails in the tool's own call, where its
        # author can see it, not later in the publisher.
        what = "ctx.partial" if partial else "ctx.progress"
        try:
            encoded = _encode(data)
        except RecursionError:
            raise ValueError(f"{what}: the value is nested too deeply to be sent as JSON") from None
        except TypeError as exc:
            raise TypeError(f"{what}: the value cannot be sent as JSON ({describe(exc)})") from exc
        except (ValueError, msgspec.EncodeError) as exc:  # text that is not UTF-8, say
            raise ValueError(f"{what}: the value cannot be sent as JSON ({describe(exc)})") from exc
        if len(encoded) > MAX_EVENT_BYTES:
            raise ValueError(f"{what}: the event would be {len(encoded):,} bytes, over the limit of "
                             f"{MAX_EVENT_BYTES:,} bytes for one event: send less at a time")
        self._emit(encoded, partial)

    def _start(self, call: asyncio.Future[Any]) -> None:
        self._loop = running_loop()
        self._call = call

    def _cancel(self) -> None:
        """Stop the call: a sync tool sees ``cancelled``; an async one is cancelled before its
        next step, not after whatever callbacks are already queued."""
        self._cancelled = True
        if self._call is not None:
            self._call.cancel()


def _check_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"ctx.progress: {name} must be a number, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"ctx.progress: {name} must be a finite number, not {value}")
