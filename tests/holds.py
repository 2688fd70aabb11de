"""``Holds``: a worker's runtime holding nothing, for tests of its heartbeat (``Presence``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from carmy_worker.store.roster import Holding


class Holds:
    """A runtime holding nothing, as the heartbeat thread sees it; ``unsure`` as ``Runtime``'s.
    ``admit(exec_id)`` is an execution admitted now, which a full beat under way is told of."""

    unsure = False
    _watching: set[str] | None = None

    @contextlib.contextmanager
    def watch_admits(self) -> Iterator[set[str]]:
        self._watching = set()
        try:
            yield self._watching
        finally:
            self._watching = None

    def admit(self, exec_id: str) -> None:
        if self._watching is not None:
            self._watching.add(exec_id)

    def holdings(self) -> list[Holding]:
        return []

    def locked_holdings(self) -> list[Holding]:
        return []

    def attempt_of(self, exec_id: str, *, claimed_before: float) -> int | None:
        return None
