"""A background loop's failures, told once an episode rather than once a pass.

The worker's job loop, callback loop and janitor try again after any error (each pass is safe to
repeat), about once a second. Logged each time, a Redis outage of an hour wrote some 3,600 lines
per loop and worker, where the heartbeat, the queue and the listeners say it once and say when it
ends. ``Failures`` does the same for a loop: its first error is a warning, another kind of error
is one too (a bug beside an outage is not hidden by it), the same one again only once a minute
with how long it has lasted, and the first pass that succeeds after them says the loop works
again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

# While the same error goes on, it is told again this often (a line a minute, not one a pass).
REMIND_S = 60.0


class Failures:
    """The failures of the loop ``what`` (its name in ``log``'s lines), since it last worked."""

    def __init__(self, what: str, log: logging.Logger, *, remind_s: float = REMIND_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.log = log
        self.remind_s = remind_s
        self._clock = clock
        self._since: float | None = None  # when the first failure of this episode came
        self._told_at = 0.0
        self._kind = ""  # the last error told's type

    def failed(self, exc: BaseException) -> None:
        """A pass failed with ``exc``: told if it is the episode's first, of another kind than the
        last told, or the same for ``remind_s`` since it was."""
        now, kind = self._clock(), type(exc).__name__
        if self._since is None:
            self._since, self._told_at, self._kind = now, now, kind
            self.log.warning("%s: %s", self.what, exc)
        elif kind != self._kind or now - self._told_at >= self.remind_s:
            self._told_at, self._kind = now, kind
            self.log.warning("%s: %s (failing for %.0f s)", self.what, exc, now - self._since)

    def worked(self) -> None:
        """A pass succeeded: the end of an episode is told."""
        if self._since is not None:
            self.log.info("%s: working again after %.1f s", self.what, self._clock() - self._since)
            self._since = None
