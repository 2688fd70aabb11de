"""What a worker process closes when it stops: resources that tools share across calls (a pooled
HTTP client, say), opened on first use and registered here, closed once the running executions
have drained (``runtime.service``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("carmy.worker")

_closers: list[Callable[[], Awaitable[object]]] = []


def on_shutdown(close: Callable[[], Awaitable[object]]) -> None:
    """Call ``close()`` (awaited) when this worker process stops, after its last execution."""
    _closers.append(close)


async def shut_down() -> None:
    """Run every registered closer once, newest first; one that fails is logged, not raised, so
    the others still run."""
    while _closers:
        close = _closers.pop()
        try:
            await close()
        except Exception:
            log.exception("closing a shared resource failed at shutdown")
