"""Tools' locks (``parallel_safe=False``): TAKE, RENEW and RELEASE, each behind one typed call.

A tool's lock (``keys.lock``) holds the attempt that runs it (``roster.lock_holder``), with a
lease its holder renews while it runs. Taking it also marks the execution's ``began``: the
attempt is about to start a tool that may not run twice, so a later attempt of a non-idempotent
execution is judged uncertain rather than run again (``store.attempts``). That mark is a write a
failover must not lose, like CLAIM's and BEGIN's: with ``CARMY_REDIS_WAIT_REPLICAS`` > 0, TAKE
waits for the replicas before the tool begins (``store.durable``).
"""

from __future__ import annotations

from typing import Literal

from redis.asyncio import Redis

from carmy_worker.store import keys
from carmy_worker.store.durable import Durability
from carmy_worker.store.lua import ACCEPTED_WORK
from carmy_worker.store.roster import lock_holder
from carmy_worker.store.scripts import Script, bind

# Takes the tool for one attempt, which then begins its tool: marked in the execution, so that
# a non-idempotent execution whose worker dies while it waits is tried again, not judged
# uncertain. An attempt that is no longer current (its worker was paused while it waited, and
# the execution went to another) takes nothing: -1. Else 1 if taken, 0 if held by another.
# KEYS: lock, exe; ARGV: holder, lease ms, attempt, worker_id
TAKE = Script("TAKE", ACCEPTED_WORK + """
local h = redis.call('HMGET', KEYS[2], 'attempt', 'reaped', 'state', 'worker')
if h[1] ~= ARGV[3] or h[2] == ARGV[3] or h[3] ~= 'running' or h[4] ~= ARGV[4] then return -1 end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('HSET', KEYS[2], 'began', ARGV[3])
return 1
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
_TAKEN: dict[int, Taken] = {1: "taken", 0: "held", -1: "lost"}


class ToolLocks:
    """The locks of one worker's tools, on one client (its scripts registered once)."""

    def __init__(self, redis: Redis, *, worker_id: str, durability: Durability | None = None) -> None:
        self.worker_id = worker_id
        self._take = bind(redis, TAKE, durability=durability)  # it marks `began`
        self._renew = bind(redis, RENEW)
        self._release = bind(redis, RELEASE)

    async def take(self, tool: str, exec_id: str, attempt: int, *, lease_ms: int) -> Taken:
        """Take ``tool``'s lock for ``attempt`` at ``exec_id``, for ``lease_ms``, if it is free
        and that attempt is still the execution's current one on this worker."""
        reply = await self._take(keys=[keys.lock(tool), keys.execution(exec_id)],
                                 args=[lock_holder(exec_id, attempt), lease_ms, attempt, self.worker_id])
        return _TAKEN[int(reply)]

    async def renew(self, tool: str, exec_id: str, attempt: int, *, lease_ms: int) -> bool:
        """Extend the lease; False if the attempt no longer holds the lock (its lease ran out)."""
        return bool(await self._renew(keys=[keys.lock(tool)], args=[lock_holder(exec_id, attempt), lease_ms]))

    async def release(self, tool: str, exec_id: str, attempt: int) -> bool:
        """Release the lock if the attempt still holds it."""
        return bool(await self._release(keys=[keys.lock(tool)], args=[lock_holder(exec_id, attempt)]))
