"""Large values kept out of Lua: written to a staged key by a plain ``SET`` sent just ahead of
the script that stores them, in the same write when the script is batched (``Batch.call``'s
``before``; otherwise on its own just before it: ``Runs.queue``), and the script renames the
staged key into place instead of taking the value as an argument.

Redis 7.0's Lua hashes every byte of every string a script is handed, about 1.2 ns a byte on
Redis's one thread: a megabyte argument cost a script 1.5 ms of it, a plain ``SET`` of it 0.3 ms
(bench/README.md, "The cost per byte, and the heap"). SUBMIT stages a large job this way
(``store.submit``), SETTLE a large record (``store.attempts``). Each script drops its staged key
with any answer but the one that renamed it, and answers that it found the key gone (expired, or
lost to a failover or a slot's move before the script ran) with nothing written, for its caller
to send the value inline.
"""

from __future__ import annotations

from typing import Any

# A value this large is staged (below it, the SET's command costs Redis about what the bytes'
# trip through Lua would: bench/README.md, "Large arguments staged").
STAGE_BYTES = 64 * 1024
# A staged value its script never reached (its process died between the two, or Redis refused the
# script at its memory limit after taking the SET) is gone this long after. The script follows the
# SET at once; one sent again later finds the key gone, and the value is sent inline.
STAGE_TTL_MS = 60_000


# Lua for the script that stores the value: `staged` (its value argument is '', the value waits
# at its staged key), `present(stage)` (whether a staged value is there to place: check before
# any write, and answer "gone" if not), `place(stage, key, value, seconds)` (the value at `key`
# for `seconds`: the staged key renamed, or `value` written), and `drop(stage)` (a staged value
# not placed: after any answer but the one that placed it).
LUA_STAGED = """
local function present(stage) return redis.call('EXISTS', stage) == 1 end
local function place(stage, key, value, seconds)
  if value ~= '' then return redis.call('SET', key, value, 'EX', seconds) end
  redis.call('RENAME', stage, key)
  redis.call('EXPIRE', key, seconds)
end
local function drop(stage) redis.call('DEL', stage) end
"""


def staged(value: bytes) -> bool:
    """Whether ``value`` goes through a staged key."""
    return len(value) >= STAGE_BYTES


def stage(key: str, value: bytes) -> tuple[Any, ...]:
    """The command that stages ``value`` at ``key`` (a ``before``: ``Batch.call``)."""
    return ("SET", key, value, "PX", STAGE_TTL_MS)
