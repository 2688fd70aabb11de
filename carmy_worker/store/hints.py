"""Where a worker over several partitions last saw work due: where its next LEASE goes.

Every LEASE reply ends with how many jobs of its queue are still due and unleased. A worker keeps
the latest count per queue, so that a freed slot's LEASE (the one a SETTLE carries, or the take
of a slot freed) goes to a partition known to have work instead of the next one in turn, which
at load, with a few jobs spread over many partitions, is usually empty: its slot would then fall
back to the wait on every partition (a LEASE per partition, each with a wake-up of its own).

A count is a hint, not a promise: other workers lease meanwhile, and SUBMIT adds work no hint
has seen (its wake token does: the idle wait finds it). Fairness does not rest on the counts: the
partitions are still served in turn, and one known to be empty is skipped only once, then looked
at again on the next pass, so that a flood in one partition never hides a job that came since in
another for more than two passes (``tests/carmy_worker/runtime/test_served.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# Which queues a LEASE may go to now (``Leases.answering``); the others are passed over.
Usable = Callable[[str], bool]


class DueHints:
    """The last count of due jobs seen per queue (absent: not known)."""

    __slots__ = ("_due",)

    def __init__(self) -> None:
        self._due: dict[str, int] = {}

    def seen(self, queue: str, due: int) -> None:
        """A LEASE of ``queue`` replied that ``due`` jobs there are still due and unleased."""
        self._due[queue] = due

    def with_work(self, queues: Sequence[str], start: int, usable: Usable | None = None) -> int | None:
        """The first of ``queues`` from index ``start`` on (round robin) known to have due work,
        of those ``usable`` allows."""
        for step in range(len(queues)):
            index = (start + step) % len(queues)
            if self._due.get(queues[index], 0) > 0 and (usable is None or usable(queues[index])):
                return index
        return None

    def maybe_work(self, queues: Sequence[str], start: int, usable: Usable | None = None) -> int | None:
        """The first of ``queues`` from index ``start`` on not known to be empty, of those
        ``usable`` allows (the others are passed over as they are); those passed over for being
        empty are not known any more (the next pass looks at them). None: every one was known
        empty or not usable (each empty one is looked at on the next call)."""
        for step in range(len(queues)):
            index = (start + step) % len(queues)
            if self._due.get(queues[index]) == 0:
                del self._due[queues[index]]
                continue
            if usable is not None and not usable(queues[index]):
                continue
            return index
        return None
