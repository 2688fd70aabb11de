"""What the Lua scripts share: Redis's clock, and imposing a record over whoever holds an
execution.

Every script of the store is called through one typed wrapper next to its source (named
parameters in, a typed result out); nothing else builds a script's ``KEYS`` or ``ARGV``.
"""

from __future__ import annotations

from carmy_worker.store.metrics import LUA_COUNT

# Time comes from Redis, so API and worker clocks never have to agree.
NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# Writes a record in place of whoever holds the execution (the janitor, a cancel): bumping the
# attempt fences out a late writer of the old one.
IMPOSE = LUA_COUNT + """
local function impose(exe, rec, pending, exec_id, stored, retention, channel, final, label)
  local t = redis.call('TIME')
  redis.call('HINCRBY', exe, 'attempt', 1)
  redis.call('SET', rec, stored, 'EX', tonumber(retention))
  redis.call('HSET', exe, 'state', 'done', 'ended_at', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  redis.call('ZREM', pending, exec_id)
  redis.call('PUBLISH', channel, final)
  count(label)
end
"""


def text(reply: bytes | str) -> str:
    """A status string a script returned (bytes from a client without decode_responses)."""
    return reply.decode() if isinstance(reply, bytes) else reply
