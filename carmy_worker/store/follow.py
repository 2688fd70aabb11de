"""JOIN: follow an execution someone else submitted (a retry with the same ``request_id``,
possibly on another API replica; ``GET /agent/executions/{id}/events``; a DELETE waiting for the
cancellation), in one round trip.

Its events go where SUBMIT's caller named (``lua.EMIT``); JOIN adds the joiner's channel to the
execution's ``joined`` channels, and sets ``stream`` if the joiner relays every event. Being a
script, it runs between two of the execution's events, never across one: either the record is
already there (and returned), or every event after it, the final one included, reaches the
joiner's channel. Nothing falls between "not settled yet" and "following".
"""

from __future__ import annotations

from msgspec import Struct
from redis.asyncio import Redis

from carmy_worker.store import keys, records
from carmy_worker.store.lua import ACCEPTED_WORK, text
from carmy_worker.store.scripts import Script, bind
from carmy_worker.wire import Record, record_decoder

# KEYS: exe, record; ARGV: the joiner's channel, '1' if it streams
# Returns {'done', record}, {'gone'} (no record, no hash: the store lost it), or {state}.
JOIN = Script("JOIN", ACCEPTED_WORK + """
local rec = redis.call('GET', KEYS[2])
if rec then return {'done', rec} end
local h = redis.call('HMGET', KEYS[1], 'state', 'reply', 'joined')
if not h[1] then return {'gone'} end
local joined = h[3] or ''
if h[2] ~= ARGV[1] and not string.find(' ' .. joined .. ' ', ' ' .. ARGV[1] .. ' ', 1, true) then
  redis.call('HSET', KEYS[1], 'joined', joined == '' and ARGV[1] or joined .. ' ' .. ARGV[1])
end
if ARGV[2] == '1' then redis.call('HSET', KEYS[1], 'stream', '1') end
return {h[1]}
""")


class Joined(Struct):
    """Where the execution stood when the joiner began to follow it: ``queued`` or ``running``
    (its events from now on reach the joiner), or ``done`` with its ``record``."""

    state: str
    record: Record | None = None


class Join:
    """JOIN on one client."""

    def __init__(self, redis: Redis) -> None:
        self._script = bind(redis, JOIN)

    async def __call__(self, exec_id: str, tool: str, *, channel: str, stream: bool) -> Joined:
        """Send ``exec_id``'s events to ``channel`` from now on (every one if ``stream``, else the
        final one), unless it is done. If Redis lost the execution (restarted without
        persistence, say), nobody will ever settle it: it is done, with a synthesized (not
        stored) uncertain record."""
        reply = await self._script(keys=[keys.execution(exec_id), keys.record(exec_id)],
                                   args=[channel, "1" if stream else ""])
        state = text(reply[0])
        if state == "done":
            return Joined("done", record_decoder.decode(reply[1]))
        if state == "gone":
            return Joined("done", records.uncertain(exec_id, tool, "the store lost track of it"))
        return Joined(state)
