"""What a tool knows about the call it serves: ``AgentContext`` (the trusted identity) and
``Context`` (that plus the execution, progress reporting and cancellation)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import Struct

from carmy_worker.wire import ProgressData


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
    ``tool.completed``. ``cancelled`` turns true when the caller went away or the timeout
    passed, so a sync tool can stop early; an async tool also gets ``CancelledError``.
    """

    def __init__(
        self,
        *,
        execution_id: str,
        tool: str,
        request_id: str | None,
        agent: AgentContext,
        emit: Callable[[bytes], None],
    ) -> None:
        self.execution_id = execution_id
        self.tool = tool
        self.request_id = request_id
        self.principal = agent.principal
        self.session = agent.session
        self.permissions = agent.permissions
        self.metadata = agent.metadata
        self._emit = emit
        self._cancelled = threading.Event()
        self._last_progress: float | int = 0

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def progress(
        self, progress: float | int, total: float | int | None = None, message: str | None = None
    ) -> None:
        """Report how far the tool is; relayed as a ``tool.progress`` event."""
        self._last_progress = progress
        self._send(ProgressData(
            execution_id=self.execution_id, tool=self.tool, progress=progress, total=total, message=message
        ))

    def partial(self, value: Any) -> None:
        """Send a partial result (any JSON-encodable value) as a ``tool.progress`` event."""
        self._send(ProgressData(
            execution_id=self.execution_id, tool=self.tool, progress=self._last_progress, partial=value
        ))

    def _send(self, data: ProgressData) -> None:
        if self._cancelled.is_set():
            return
        # Encode here so a value that is not JSON fails in the tool's own call, where its
        # author can see it, not later in the publisher.
        self._emit(_encode(data))

    def _cancel(self) -> None:
        self._cancelled.set()
