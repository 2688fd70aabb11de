"""How many partitions the store's keys are spread over (``CARMY_REDIS_PARTITIONS``), and the
check that every process agrees on it.

An execution's partition is a function of its id and of the count (``keys.partition_of``): two
processes that disagree on the count look for the same execution in two places. So the first
process to start records the count in Redis (``keys.PARTITIONS``, a key in a slot of its own),
and every process that starts afterwards compares its own with it, refusing to start, saying why,
when they differ. Changing the count of a deployment means emptying Redis (or moving every key):
nothing rehashes a live store.
"""

from __future__ import annotations

import logging

from redis.asyncio import Redis
from redis.exceptions import OutOfMemoryError

from carmy_worker.settings import SettingsError
from carmy_worker.store import keys

log = logging.getLogger("carmy.store")


class PartitionsDisagree(SettingsError):
    """This process's ``CARMY_REDIS_PARTITIONS`` is not the count recorded in Redis."""


def message(mine: int, recorded: int) -> str:
    return (f"CARMY_REDIS_PARTITIONS is {mine} here but {recorded} in Redis ({keys.PARTITIONS}, written by the "
            f"first process of this deployment): set it to {recorded} on every API and worker (changing it "
            "needs an empty Redis: executions are found by their partition)")


async def agree(redis: Redis, count: int) -> None:
    """Record ``count`` if no process did, else ``PartitionsDisagree`` unless it is the same.

    Read first: a Redis over its ``maxmemory`` refuses any SET, even one that would write
    nothing, and a worker must start then to serve the work already accepted (docs/architecture.md,
    "A full Redis"). Recorded with ``SET NX GET`` (Redis 7), so two first processes cannot both win; a
    full Redis that has no count yet is told so in the log, and the next process records it."""
    recorded = await redis.get(keys.PARTITIONS)
    if recorded is None:
        try:
            recorded = await redis.set(keys.PARTITIONS, count, nx=True, get=True)
        except OutOfMemoryError:
            log.warning("Redis is full: CARMY_REDIS_PARTITIONS (%d) is not recorded yet", count)
            return
    if recorded is not None and int(recorded) != count:
        raise PartitionsDisagree(message(count, int(recorded)))
