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

from redis.asyncio import Redis

from carmy_worker.settings import SettingsError
from carmy_worker.store import keys


class PartitionsDisagree(SettingsError):
    """This process's ``CARMY_REDIS_PARTITIONS`` is not the count recorded in Redis."""


def message(mine: int, recorded: int) -> str:
    return (f"CARMY_REDIS_PARTITIONS is {mine} here but {recorded} in Redis ({keys.PARTITIONS}, written by the "
            f"first process of this deployment): set it to {recorded} on every API and worker (changing it "
            "needs an empty Redis: executions are found by their partition)")


async def agree(redis: Redis, count: int) -> None:
    """Record ``count`` if no process did, else ``PartitionsDisagree`` unless it is the same. In
    one round trip (``SET NX GET``: Redis 7), so two first processes cannot both win."""
    recorded = await redis.set(keys.PARTITIONS, count, nx=True, get=True)
    if recorded is not None and int(recorded) != count:
        raise PartitionsDisagree(message(count, int(recorded)))
