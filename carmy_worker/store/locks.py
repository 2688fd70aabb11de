"""Tools' locks (``parallel_safe=False``): TAKE, RENEW and RELEASE, each behind one typed call.

A tool's lock (``keys.lock``: a slot of its own, ``{lock:<tool>}``) holds the attempt that runs
it (``roster.lock_holder``), with a lease its holder renews while it runs. Taking it also marks
the execution's ``began``: the attempt is about to start a tool that may not run twice, so a
later attempt of a non-idempotent execution is judged uncertain rather than run again
(``store.attempts``).

The lock and the execution are in different slots (the lock is every partition's), so taking it
is two scripts, each in one slot: TAKE sets the lock for the attempt, then BEGIN (``HOLDS``
with ``began``, in the execution's slot) checks that the attempt is still the execution's
current one and marks it begun; an attempt that is not releases the lock at once. So an attempt
given away while it waited never begins its tool and records nothing, as when one script did
both; it may hold the lock for one round trip (or, if its worker dies right then, until the
lease runs out). That costs one round trip more than one script did. Both writes are ones a
failover must not lose (the lock: two attempts would run at once; ``began``: a rerun of a tool
that may not run twice): with ``CARMY_REDIS_WAIT_REPLICAS`` > 0, each waits for the replicas of
its own primary before the tool begins (``store.durable``).
"""

from __future__ import annotations

from typing import Literal

from redis.asyncio import Redis

from carmy_worker.store import keys
from carmy_worker.store.attempts import HOLDS
from carmy_worker.store.durable import Durability
from carmy_worker.store.lua import ACCEPTED_WORK
from carmy_worker.store.roster import lock_holder
from carmy_worker.store.scripts import Script, bind

# Takes the tool for one holder: 1 if taken (or already its own: a retry after an error whose
# reply was lost takes it again, lease renewed), 0 if held by another.
# KEYS: lock; ARGV: holder, lease ms
TAKE = Script("TAKE", ACCEPTED_WORK + """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
""")
# KEYS: lock; ARGV: holder, lease ms. Extends the lease only for its holder.
RENEW = Script("RENEW", ACCEPTED_WORK + (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"))
# KEYS: lock; ARGV: holder. Releases only its own hold.
RELEASE = Script("RELEASE", ACCEPTED_WORK + (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"))

# taken: the attempt has the tool (and ``began`` is marked); held: another attempt has it;
# lost: the attempt is no longer current (it takes nothing and must record nothing).
Taken = Literal["taken", "held", "lost"]


class ToolLocks:
    """The locks of one worker's tools, on one client (its scripts registered once)."""

    def __init__(self, redis: Redis, *, worker_id: str, durability: Durability | None = None) -> None:
        self.worker_id = worker_id
        self._take = bind(redis, TAKE, durability=durability)
        self._begin = bind(redis, HOLDS, durability=durability)  # it marks `began`
        self._renew = bind(redis, RENEW)
        self._release = bind(redis, RELEASE)

    async def take(self, tool: str, exec_id: str, attempt: int, *, lease_ms: int) -> Taken:
        """Take ``tool``'s lock for ``attempt`` at ``exec_id``, for ``lease_ms``, if it is free
        and that attempt is still the execution's current one on this worker (then marked as
        having begun its tool)."""
        holder = lock_holder(exec_id, attempt)
        if not await self._take(keys=[keys.lock(tool)], args=[holder, lease_ms]):
            return "held"
        if await self._begin(keys=[keys.execution(exec_id)], args=[attempt, self.worker_id, "1"]):
            return "taken"
        await self._release(keys=[keys.lock(tool)], args=[holder])
        return "lost"

    async def renew(self, tool: str, exec_id: str, attempt: int, *, lease_ms: int) -> bool:
        """Extend the lease; False if the attempt no longer holds the lock (its lease ran out)."""
        return bool(await self._renew(keys=[keys.lock(tool)], args=[lock_holder(exec_id, attempt), lease_ms]))

    async def release(self, tool: str, exec_id: str, attempt: int) -> bool:
        """Release the lock if the attempt still holds it."""
        return bool(await self._release(keys=[keys.lock(tool)], args=[lock_holder(exec_id, attempt)]))
