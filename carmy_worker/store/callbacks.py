"""Jobs' callbacks in Redis: which are due, and the outcome of each delivery attempt.

A callback is made due by the script that finishes its job (``store.jobstore``'s FINISH_JOB, in
CONCLUDE and CANCEL_JOB), so that no crash between the two can lose it: the job's hash holds its
state (``notify_state`` ``pending``, ``notify_id`` its webhook-id, ``notify_since``,
``notify_tries``, ``notify_log`` the latest attempts) and ``keys.callbacks_due`` of the job's
partition lists it by when its next attempt is due. A worker's callback loop (``jobs.callbacks``)
takes the due ones of every partition, leased as LOOK leases due jobs, delivers each, and records
the attempt here.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from carmy_worker.store import keys
from carmy_worker.store.lua import ACCEPTED_WORK, NOW, text
from carmy_worker.store.scripts import Script, bind

LEASE_MS = 30_000  # how long a callback taken stays out of the other loops' sight (a delivery's timeout is 10 s)
KEEP_ATTEMPTS = 10  # attempts the job's view lists, the latest

# The callbacks due now (at most ARGV[1]), leased to this loop for ARGV[2] ms: pushed out of the
# other loops' sight, so that each attempt is made by one loop; RECORD moves or removes it, and
# one a dead loop had leased comes back when its lease ends. And Redis's clock.
# KEYS: callbacks due; ARGV: at most, lease ms
LOOK_CALLBACKS = Script("CALLBACKS_LOOK", ACCEPTED_WORK + NOW + """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(due) do redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), id) end
return {due, tostring(now)}
""")

# An attempt at a callback: only if the callback is still pending under the same webhook-id (an
# operator's retry finishing the job again makes another), the attempt joins the job's latest
# ARGV[7], then the callback is `delivered`, `undeliverable` (ARGV[3] 'final', or its window of
# ARGV[6] ms since it became due would be over by the next attempt) or due again in ARGV[4] ms.
# Outcome 'later' is no attempt: the callback was taken but not tried (its receiver had enough
# under way), and is due again in ARGV[4] ms, its attempts and window as they were.
# A callback whose job is gone, or no longer pending, is forgotten.
# KEYS: job, callbacks due
# ARGV: job_id, webhook-id, outcome ('delivered', 'retry', 'final', 'later'), delay ms, attempt JSON, window ms, keep
RECORD_CALLBACK = Script("CALLBACKS_RECORD", ACCEPTED_WORK + NOW + """
local h = redis.call('HMGET', KEYS[1], 'notify_id', 'notify_state', 'notify_since', 'notify_log')
if h[2] ~= 'pending' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 'gone'
end
if h[1] ~= ARGV[2] then return 'stale' end
if ARGV[3] == 'later' then
  redis.call('ZADD', KEYS[2], 'XX', now + tonumber(ARGV[4]), ARGV[1])
  return 'pending'
end
local entries = {}
for e in string.gmatch(h[4] or '', '[^\\n]+') do table.insert(entries, e) end
table.insert(entries, ARGV[5])
while #entries > tonumber(ARGV[7]) do table.remove(entries, 1) end
redis.call('HSET', KEYS[1], 'notify_log', table.concat(entries, '\\n'))
redis.call('HINCRBY', KEYS[1], 'notify_tries', 1)
local state = 'pending'
if ARGV[3] == 'delivered' then
  state = 'delivered'
elseif ARGV[3] == 'final' or now + tonumber(ARGV[4]) > tonumber(h[3]) + tonumber(ARGV[6]) then
  state = 'undeliverable'
end
if state == 'pending' then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[1])
else
  redis.call('HSET', KEYS[1], 'notify_state', state)
  redis.call('ZREM', KEYS[2], ARGV[1])
end
return state
""")


@dataclass(frozen=True)
class DueCallbacks:
    """The jobs whose callback is due now (leased to the caller), and Redis's clock (ms)."""

    job_ids: list[str]
    now_ms: int


class Callbacks:
    """LOOK and RECORD of callbacks, on one client."""

    def __init__(self, redis: Redis) -> None:
        self._look = bind(redis, LOOK_CALLBACKS)
        self._record = bind(redis, RECORD_CALLBACK)

    async def look(self, partition: int, *, at_most: int = 20, lease_ms: int = LEASE_MS) -> DueCallbacks:
        """LOOK in ``partition``: its callbacks due now, leased to the caller."""
        due, now = await self._look(keys=[keys.callbacks_due(partition)], args=[at_most, lease_ms])
        return DueCallbacks([text(j) for j in due], int(now))

    async def later(self, job_id: str, message_id: str, delay_ms: int) -> str:
        """RECORD's ``later``: the callback taken but not tried is due again in ``delay_ms``,
        with no attempt counted; its state as ``record`` says it."""
        return await self.record(job_id=job_id, message_id=message_id, outcome="later", delay_ms=delay_ms,
                                 attempt=b"", window_ms=0)

    async def record(self, *, job_id: str, message_id: str, outcome: str, delay_ms: int, attempt: bytes,
                     window_ms: int, keep: int = KEEP_ATTEMPTS) -> str:
        """RECORD: the callback's state after this attempt (``pending``, ``delivered``,
        ``undeliverable``), or ``stale``/``gone`` if it was no longer the one pending."""
        due = keys.callbacks_due(keys.partition_of(job_id))
        return text(await self._record(keys=[keys.job(job_id), due],
                                       args=[job_id, message_id, outcome, delay_ms, attempt, window_ms, keep]))
