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

from collections.abc import Mapping

from redis.asyncio import Redis

from carmy_worker.settings import SettingsError, env_int
from carmy_worker.store import keys

# A single Redis (or Sentinel's primary) runs every script on one core whatever the count: one
# partition keeps its keys as few as they can be. A cluster spreads them: 16 partitions over
# three primaries put five or six on each, and leave room for six or eight primaries.
SINGLE_DEFAULT = 1
CLUSTER_DEFAULT = 16
# Every partition is served by every worker (a connection per partition blocked on its wake
# lists): the bound keeps that, and the cross-partition reads, small.
MAXIMUM = 256


class PartitionsDisagree(SettingsError):
    """This process's ``CARMY_REDIS_PARTITIONS`` is not the count recorded in Redis."""


def from_env(env: Mapping[str, str], *, cluster: bool) -> int:
    """``CARMY_REDIS_PARTITIONS``: 1 on a single Redis, 16 on a cluster unless set."""
    default = CLUSTER_DEFAULT if cluster else SINGLE_DEFAULT
    count = env_int(env, "CARMY_REDIS_PARTITIONS", default)
    if not 1 <= count <= MAXIMUM:
        raise SettingsError(f"CARMY_REDIS_PARTITIONS must be between 1 and {MAXIMUM}, got {count}")
    return count


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
