"""Which partitions a loop reached lately, so that one unreachable primary delays only its own
partitions' work.

On a Redis Cluster one primary can be down (killed, until its replica is promoted: about 5 s
on loopback here) while the others answer. The job loop, the callback loop and an idle
worker's wait on every wake list work partition by partition; had they failed on the first
refusal, as they did, every partition's due jobs, conclusions, schedules, callbacks and calls
would have waited for one primary's failover. With this, a partition whose call fails is left
for ``RETRY_AFTER_S`` (its work stays in Redis: a lease taken there expires, an occurrence is
fired within its grace) and the others go on. Each partition's going and coming back is logged
once.

A redirection (``MOVED``, ``ASK``, ``TRYAGAIN``: the partition's slot moved, or is moving, to
another primary) is no outage: nothing ran, the slot table is reloaded before the next command,
and the partition is tried again after ``MOVED_PAUSE_S`` rather than a second later (calls of a
partition whose slot moved waited a second more for a worker before this).

On one Redis (one partition) there is nothing else to go on with: errors are the caller's, as
before (the loop logs them and pauses).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import RedisError

from carmy_worker.store import keys
from carmy_worker.store.cluster import MOVED

T = TypeVar("T")

# A partition whose call failed is tried again after this long: often enough to be back within
# a second of its primary, rarely enough that a primary that hangs (each try a socket timeout)
# holds the others' passes up seldom.
RETRY_AFTER_S = 1.0
# A partition whose slot moved or is moving is tried again after this: the slot table is
# reloaded by then, and a migration's TRYAGAIN lasts as long as its MIGRATE batches (ms).
MOVED_PAUSE_S = 0.05


class Reach:
    """The partitions ``what`` (a loop's name, for its lines in ``log``) could not reach lately."""

    def __init__(self, what: str, log: logging.Logger, *, retry_after_s: float = RETRY_AFTER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.log = log
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._down: dict[int, float] = {}  # partition → when to try it again
        self._told: set[int] = set()  # the partitions whose outage was logged (their return is, too)
        self._moved_since: dict[int, float] = {}  # partition → its first redirection since it last answered

    @property
    def any_down(self) -> bool:
        """Whether some partition failed lately (and has not answered since)."""
        return bool(self._down)

    def reachable(self, partition: int) -> bool:
        """Whether to try ``partition`` now: it answered last time, or its pause is over."""
        again = self._down.get(partition)
        return again is None or self._clock() >= again

    def answers(self, partition: int) -> bool:
        """Whether ``partition`` answered since it last failed (or never failed)."""
        return partition not in self._down

    def partitions(self) -> list[int]:
        """The partitions to try now, in order."""
        return [p for p in keys.partitions() if self.reachable(p)]

    async def run(self, partition: int, work: Callable[[], Awaitable[T]]) -> T | None:
        """``work()``'s result, or None if ``partition`` is paused or its call failed with a
        Redis or connection error (then it is paused). With one partition the error is raised."""
        if keys.partition_count() == 1:
            return await work()
        if not self.reachable(partition):
            return None
        try:
            result = await work()
        except (RedisError, OSError) as exc:
            self.failed(partition, exc)
            return None
        self.answered(partition)
        return result

    def failed(self, partition: int, exc: BaseException) -> None:
        """``partition`` did not answer: pause it (briefly if its slot moved)."""
        now = self._clock()
        # Redirected for a second on end is no longer a slot on the move (a slot table that
        # stays wrong): from then on it is paused and told as an outage is.
        if isinstance(exc, MOVED) and now - self._moved_since.setdefault(partition, now) < self.retry_after_s:
            self._down[partition] = now + MOVED_PAUSE_S
            return
        if partition not in self._told:
            self._told.add(partition)
            self.log.warning("%s: partition %d unreachable (%s: %s); the other partitions go on, it is tried "
                        "again every %.0f s", self.what, partition, type(exc).__name__, exc, self.retry_after_s)
        self._down[partition] = now + self.retry_after_s

    def answered(self, partition: int) -> None:
        """``partition`` answered: no longer paused."""
        self._down.pop(partition, None)
        self._moved_since.pop(partition, None)
        if partition in self._told:
            self._told.discard(partition)
            self.log.info("%s: partition %d answers again", self.what, partition)
