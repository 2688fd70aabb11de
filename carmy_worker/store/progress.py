"""PROGRESS: publish a ``tool.progress`` event (to whoever streams it: ``lua.EMIT``) and keep its
message, if any, as the running execution's latest status (what polling and an MCP task say
while it runs), in one round trip."""

from __future__ import annotations

from redis.asyncio import Redis

from carmy_worker.store import keys
from carmy_worker.store.lua import ACCEPTED_WORK, EMIT, FOLLOWERS, HELD, HOLDING, NOW
from carmy_worker.store.scripts import Script, bind

# Only from the attempt that holds the execution (lua.HELD: the current one, not reaped, running
# on this worker; `running` also means no record yet). An event of an attempt that lost its
# execution is dropped: a sync tool's thread that goes on reporting after its worker was paused
# and its execution handed to another attempt, or events still waiting to be published when the
# worker woke. Published, it would reach the current attempt's followers and replace that
# attempt's status message; after a record, reach nobody. The status message is kept even when
# nobody streams the events: MCP's tasks/get and the console read it. Returns 1 if published, 0
# if dropped.
# KEYS: exe; ARGV: events channel, event, status message, '1' if there is a message, exec_id,
#       attempt, worker_id
PROGRESS = Script("PROGRESS", ACCEPTED_WORK + NOW + EMIT + HELD + f"""
local h = redis.call('HMGET', KEYS[1], {HOLDING}, {FOLLOWERS})
if not held(h, ARGV[6], ARGV[7]) then return 0 end
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'message', ARGV[3], 'message_at', now) end
emit_to({{h[5], h[6], h[7]}}, ARGV[5], ARGV[1], ARGV[2], false)
return 1
""")


class Progress:
    """Publishes executions' events through PROGRESS (one per worker: registering the script
    hashes its text)."""

    def __init__(self, redis: Redis, *, worker_id: str) -> None:
        self._script = bind(redis, PROGRESS)
        self._worker_id = worker_id

    async def __call__(self, exec_id: str, attempt: int, event: bytes, message: str | None) -> bool:
        """Publish ``event`` of ``attempt`` at ``exec_id`` (and keep ``message`` as its status);
        False if that attempt no longer holds the execution, and nothing was published."""
        return bool(await self._script(keys=[keys.execution(exec_id)], args=[
            keys.events(exec_id), event, message or "", "" if message is None else "1", exec_id,
            attempt, self._worker_id]))
