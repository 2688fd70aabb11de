"""PROGRESS: publish a ``tool.progress`` event (to whoever streams it: ``lua.EMIT``) and keep its
message, if any, as the running execution's latest status (what polling and an MCP task say
while it runs), in one round trip."""

from __future__ import annotations

from redis.asyncio import Redis

from carmy_worker.store import keys
from carmy_worker.store.lua import ACCEPTED_WORK, EMIT, NOW
from carmy_worker.store.scripts import Script, bind

# Only while it runs: a late event cannot write over a settled execution, nor bring back the
# hash of one that expired (a key without a TTL). The status is kept even when nobody streams
# the events: a poll reads it.
# KEYS: exe; ARGV: events channel, event, status message, '1' if there is a message, exec_id
PROGRESS = Script("PROGRESS", ACCEPTED_WORK + NOW + EMIT + """
if ARGV[4] == '1' and redis.call('HGET', KEYS[1], 'state') == 'running' then
  redis.call('HSET', KEYS[1], 'message', ARGV[3], 'message_at', now)
end
emit(KEYS[1], ARGV[5], ARGV[1], ARGV[2], false)
return 1
""")


class Progress:
    """Publishes executions' events through PROGRESS (one per worker: registering the script
    hashes its text)."""

    def __init__(self, redis: Redis) -> None:
        self._script = bind(redis, PROGRESS)

    async def __call__(self, exec_id: str, event: bytes, message: str | None) -> None:
        await self._script(keys=[keys.execution(exec_id)], args=[
            keys.events(exec_id), event, message or "", "" if message is None else "1", exec_id])
