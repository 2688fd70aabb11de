"""Work an answer need not wait for, done a little later and together: a request's log line.

Each ``POST /agent/execute`` logs one line once answered. Written as it was, at the end of its
request's turn of the loop, every call at one client paid for a write to stderr of its own, and
paid it before the API read the client's next request, which had arrived meanwhile. Kept back
and written with the others of the last ``MAX_DELAY_S``, the API's CPU per call was 7 % lower at
one client and 3-7 % at 64 in paired rounds, and the no-op's p50 0.96x (bench/README.md, issue
35). Under load the lines of a turn already went out together; now those of several turns do.

A line is at most ``MAX_DELAY_S`` late, and so is its timestamp (the time it is written; its
fields, ``duration_ms`` included, are taken when the request ends). The app's shutdown writes
what is left; a process killed outright loses at most that much of its log's tail.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from carmy_worker.loop import running_loop

# How long deferred work may wait for the others: a request's log line is at most this late.
MAX_DELAY_S = 0.02


class Deferred:
    """Callables run together, in order, at most ``MAX_DELAY_S`` after the first of them was
    deferred (see the module)."""

    __slots__ = ("_due", "_due_on", "_work")

    def __init__(self) -> None:
        self._work: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self._due: asyncio.TimerHandle | None = None
        self._due_on: asyncio.AbstractEventLoop | None = None  # the loop of that timer

    def defer(self, work: Callable[..., None], *args: Any) -> None:
        """``work(*args)`` with the others, at most ``MAX_DELAY_S`` from now."""
        self._work.append((work, args))
        loop = running_loop()
        # (A timer on another loop, closed before it fired, would never run them.)
        if self._due is None or self._due_on is not loop:
            self._due, self._due_on = loop.call_later(MAX_DELAY_S, self.run), loop

    def run(self) -> None:
        """Run what was deferred, now; an error of one is reported as a callback's would be,
        and the rest run all the same."""
        if self._due is not None:
            self._due.cancel()
            self._due = None
        work, self._work = self._work, []
        for call, args in work:
            try:
                call(*args)
            except Exception as exc:
                running_loop().call_exception_handler({"message": "deferred work failed", "exception": exc})
