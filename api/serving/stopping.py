"""The end of a stop's grace: what still waits for an execution's outcome answers before the
server cuts it short.

On SIGTERM uvicorn stops accepting connections and gives the open requests ``GRACEFUL_SHUTDOWN``
seconds, then cancels them: a call still waiting for its outcome got uvicorn's bare text 500, and
the log a traceback. ``ANSWER_BEFORE_S`` before that, the server (``server.Server``) calls what
the app registered here (its event hub's ``stop_waiting``): each waiting request answers
``SERVER_STOPPING``, retryable, and the execution goes on, its outcome kept for a retry with the
same ``request_id`` or a ``GET`` of the execution.
"""

from __future__ import annotations

from collections.abc import Callable

GRACEFUL_SHUTDOWN = 30  # seconds open requests and SSE streams get after SIGTERM, then uvicorn cancels them
ANSWER_BEFORE_S = 1.0  # how long before the grace ends the waiting requests answer

_at_grace_end: list[Callable[[], None]] = []  # what this process's apps registered


def at_grace_end(callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` when the process's grace to stop ends; returns what unregisters it (an
    app's lifespan registers its hub as it starts, and unregisters it as it ends)."""
    _at_grace_end.append(callback)
    return lambda: _at_grace_end.remove(callback)


def grace_ends() -> None:
    """The grace is ending: every registered callback, called once."""
    for callback in list(_at_grace_end):
        callback()
