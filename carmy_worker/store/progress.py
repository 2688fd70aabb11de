"""PROGRESS: publish a ``tool.progress`` event and keep its message as the running execution's
latest status (what an MCP task says while it runs), in one round trip."""

from __future__ import annotations

from redis.asyncio import Redis

from carmy_worker.store import keys
from carmy_worker.store.lua import NOW

# Only while it runs: a late event cannot write over a settled execution, nor bring back the
# hash of one that expired (a key without a TTL).
# KEYS: exe; ARGV: events channel, event, status message
PROGRESS = NOW + """
if redis.call('HGET', KEYS[1], 'state') == 'running' then
  redis.call('HSET', KEYS[1], 'message', ARGV[3], 'message_at', now)
end
return redis.call('PUBLISH', ARGV[1], ARGV[2])
"""


class Progress:
    """Publishes one execution's events; those with a message through PROGRESS."""

    def __init__(self, redis: Redis, exec_id: str) -> None:
        self._redis = redis
        self._exe = keys.execution(exec_id)
        self._channel = keys.events(exec_id)
        self._script = redis.register_script(PROGRESS)

    async def __call__(self, event: bytes, message: str | None) -> None:
        if message is None:
            await self._redis.publish(self._channel, event)
        else:
            await self._script(keys=[self._exe], args=[self._channel, event, message])
