"""Which execution an MCP call follows (``carmy:mcpcall`` keys): REMEMBER and MARK, for
``notifications/cancelled`` across requests and API replicas (``api/mcp/cancel.py`` says why).

A call's entry is ``"<execution id> <tool> owner"`` (the call started it) or ``"... joined"``
(a retry that joined it), or ``CANCELLED_MARK`` once its cancellation came. Either may come
first: both swap the same key atomically, so whichever comes second sees the other.
"""

from __future__ import annotations

from redis.asyncio import Redis

from carmy_worker.store import keys
from carmy_worker.store.lua import ACCEPTED_WORK
from carmy_worker.store.scripts import Script, bind

CANCELLED_MARK = b"-"  # a call's entry once its cancellation arrived
CANCELLED_MARK_TTL_S = 60  # a cancellation that overtook its call waits this long for it

# Record the execution a call follows, unless its cancellation came first (the mark stays, for
# the call to find when it ends). Returns 1 if it had.
# KEYS: the call's entry; ARGV: the entry, its TTL, the mark
REMEMBER = Script("REMEMBER", ACCEPTED_WORK + """
if redis.call('GET', KEYS[1]) == ARGV[3] then return 1 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
return 0
""")

# Mark a call cancelled, keeping what is left of its entry's life (the call may run that long
# yet, and must find the mark when it ends); a cancellation that overtook its call waits
# CANCELLED_MARK_TTL_S for it. Returns the entry it replaced.
# KEYS: the call's entry; ARGV: the mark, its TTL when there was no entry
MARK = Script("MARK", ACCEPTED_WORK + """
local earlier = redis.call('GET', KEYS[1])
if earlier then
  redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
else
  redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
end
return earlier
""")


class McpCall:
    """One MCP call's name: (caller, the caller's session, ``Mcp-Session-Id``, JSON-RPC id)."""

    __slots__ = ("key",)

    def __init__(self, principal: str | None, agent_session: str | None, mcp_session: str, request_id: str) -> None:
        self.key = keys.mcp_call(principal, agent_session, mcp_session, request_id)


class McpCalls:
    """REMEMBER, MARK and a look at a call's entry, on one client."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._remember = bind(redis, REMEMBER)
        self._mark = bind(redis, MARK)

    async def remember(self, call: McpCall, exec_id: str, tool: str, ttl: int, *, owner: bool) -> bool:
        """Record the execution ``call`` follows; True if its cancellation already came."""
        entry = f"{exec_id} {tool} {'owner' if owner else 'joined'}"
        return bool(await self._remember(keys=[call.key], args=[entry, ttl, CANCELLED_MARK]))

    async def mark_cancelled(self, call: McpCall) -> tuple[str, str, bool] | None:
        """Mark ``call`` cancelled; what it followed, if it had begun: (execution id, tool,
        whether it started that execution)."""
        earlier = await self._mark(keys=[call.key], args=[CANCELLED_MARK, CANCELLED_MARK_TTL_S])
        if not earlier or earlier == CANCELLED_MARK:
            return None
        exec_id, tool, role = earlier.decode().split(" ")
        return exec_id, tool, role == "owner"

    async def is_cancelled(self, call: McpCall) -> bool:
        """Whether ``call``'s cancellation has come (its entry is the mark)."""
        return bool(await self.redis.get(call.key) == CANCELLED_MARK)
