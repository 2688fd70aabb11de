"""The Lua scripts that make every state change of an execution atomic.

An execution lives in a hash (``keys.execution``) with ``attempt``, ``state`` (queued,
running, done), ``worker``, ``cancel``, ``idem`` and ``start_by``; its outcome is one record
(``keys.record``). Every writer of the record goes through a script here, and each checks, in
one step, that no record exists yet and that it still owns the current attempt. That is what
makes "one final status, written once" hold when arq runs a job twice, when a paused worker
wakes up late, or when a janitor settles an execution whose worker died.

Time comes from Redis (``TIME``), so API and worker clocks never have to agree.
"""

from __future__ import annotations

from carmy_worker.metrics import LUA_COUNT as _COUNT
from carmy_worker.metrics import LUA_OBSERVE as _OBSERVE

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# Writes a record in place of whoever holds the execution (the janitor, a cancel): bumping the
# attempt fences out a late writer of the old one.
_IMPOSE = _COUNT + """
local function impose(exe, rec, pending, exec_id, stored, retention, channel, final, label)
  redis.call('HINCRBY', exe, 'attempt', 1)
  redis.call('SET', rec, stored, 'EX', tonumber(retention))
  redis.call('HSET', exe, 'state', 'done')
  redis.call('ZREM', pending, exec_id)
  redis.call('PUBLISH', channel, final)
  count(label)
end
"""

# KEYS: exe, pending, queued, arq job, arq queue, [idempotency]
# ARGV: exec_id, fingerprint, arq job bytes, retention s, max pending, admission deadline ms,
#       queue wait ms, workers alive (1/0), tool, owner, idempotent (1/0), record prefix, wake channel
SUBMIT = _NOW + """
if #KEYS == 6 then
  local held = redis.call('GET', KEYS[6])
  if held then
    local sep = string.find(held, ' ', 1, true)
    local other = string.sub(held, 1, sep - 1)
    if string.sub(held, sep + 1) ~= ARGV[2] then return {'conflict', other} end
    local rec = redis.call('GET', ARGV[12] .. other)
    if rec then return {'replay', other, rec} end
    return {'join', other}
  end
end
if ARGV[8] ~= '1' then return {'no_workers'} end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local pending = redis.call('ZCARD', KEYS[2])
if pending >= tonumber(ARGV[5]) then return {'full', tostring(pending)} end
local retention = tonumber(ARGV[4])
if #KEYS == 6 then
  redis.call('SET', KEYS[6], ARGV[1] .. ' ' .. ARGV[2], 'EX', retention)
end
local start_by = now + tonumber(ARGV[7])
redis.call('HSET', KEYS[1], 'tool', ARGV[9], 'owner', ARGV[10], 'idem', ARGV[11],
           'state', 'queued', 'attempt', 0, 'start_by', start_by, 'wake', ARGV[13], 'queued_at', now)
redis.call('EXPIRE', KEYS[1], retention)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[6]), ARGV[1])
redis.call('ZADD', KEYS[3], start_by, ARGV[1])
redis.call('SET', KEYS[4], ARGV[3], 'EX', retention)
redis.call('ZADD', KEYS[5], now, ARGV[1])
redis.call('PUBLISH', ARGV[13], '')
return {'new', ARGV[1]}
"""

# KEYS: exe, record, running set, queued
# ARGV: exec_id, worker_id, max attempts, events channel, tool.started event, tool
# Returns {verdict, attempt, ms it waited in the queue}.
CLAIM = _NOW + _OBSERVE + """
if redis.call('EXISTS', KEYS[2]) == 1 then return {'settled', 0, 0} end
if redis.call('EXISTS', KEYS[1]) == 0 then return {'gone', 0, 0} end
redis.call('ZREM', KEYS[4], ARGV[1])
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
local h = redis.call('HMGET', KEYS[1], 'cancel', 'idem', 'start_by', 'queued_at')
local waited = now - tonumber(h[4] or now)
if h[1] == '1' then return {'cancelled', attempt, waited} end
if attempt > 1 and h[2] ~= '1' then return {'uncertain', attempt, waited} end
if attempt > tonumber(ARGV[3]) then return {'uncertain', attempt, waited} end
if attempt == 1 and tonumber(h[3]) < now then return {'expired', attempt, waited} end
redis.call('HSET', KEYS[1], 'state', 'running', 'worker', ARGV[2])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('PUBLISH', ARGV[4], ARGV[5])
if attempt == 1 then observe('queue_wait', ARGV[6], waited) end
return {'run', attempt, waited}
"""

# A worker writes the record of its attempt: only if none exists and it still owns the
# current attempt (a paused worker waking up late finds another attempt and writes nothing).
# KEYS: exe, record, pending, running set, queued
# ARGV: exec_id, attempt, record, retention s, events channel, final event, tool.completed event or '',
#       metrics label, tool, run ms or ''
SETTLE = _COUNT + _OBSERVE + """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[2], ARGV[3], 'EX', tonumber(ARGV[4]))
redis.call('HSET', KEYS[1], 'state', 'done')
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
if ARGV[7] ~= '' then redis.call('PUBLISH', ARGV[5], ARGV[7]) end
redis.call('PUBLISH', ARGV[5], ARGV[6])
count(ARGV[8])
if ARGV[10] ~= '' then observe('run', ARGV[9], tonumber(ARGV[10])) end
return 1
"""

# Cancels an execution for its caller. One never started is settled here and now; a running
# one is signalled to every worker (the one running it answers with the record).
# KEYS: exe, record, pending, queued
# ARGV: exec_id, record, retention s, events channel, final event, cancel channel, metrics label
CANCEL = _IMPOSE + """
if redis.call('EXISTS', KEYS[2]) == 1 then return 'settled' end
if redis.call('EXISTS', KEYS[1]) == 0 then return 'gone' end
redis.call('HSET', KEYS[1], 'cancel', 1)
if redis.call('HGET', KEYS[1], 'state') == 'running' then
  redis.call('PUBLISH', ARGV[6], ARGV[1])
  return 'signalled'
end
redis.call('ZREM', KEYS[4], ARGV[1])
impose(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[7])
return 'cancelled'
"""

# An execution whose worker stopped heartbeating. Its arq lease (the in-progress key) is
# dropped so a live worker takes the job at once instead of after arq's expiry: an idempotent
# execution simply runs again; any other is settled uncertain first, so the re-delivered job
# finds it settled and never runs the tool a second time.
# KEYS: exe, record, pending, running set, arq in-progress key
# ARGV: exec_id, worker_id, record, retention s, events channel, final event, metrics label
REAP = _IMPOSE + """
redis.call('SREM', KEYS[4], ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 1 then return 'settled' end
local h = redis.call('HMGET', KEYS[1], 'worker', 'state', 'idem', 'wake')
if h[1] ~= ARGV[2] or h[2] ~= 'running' then return 'moved' end
redis.call('DEL', KEYS[5])
if h[4] then redis.call('PUBLISH', h[4], '') end
if h[3] == '1' then
  redis.call('HSET', KEYS[1], 'state', 'queued')
  return 'requeued'
end
impose(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
return 'uncertain'
"""

# An accepted execution that no worker started before its start-by instant.
# KEYS: exe, record, pending, queued
# ARGV: exec_id, record, retention s, events channel, final event, metrics label
EXPIRE_UNSTARTED = _NOW + _IMPOSE + """
local h = redis.call('HMGET', KEYS[1], 'state', 'start_by')
if h[1] ~= 'queued' or redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('ZREM', KEYS[4], ARGV[1])
  return 0
end
if tonumber(h[2]) > now then return 0 end
redis.call('ZREM', KEYS[4], ARGV[1])
impose(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
return 1
"""

# Heartbeat of a worker, on the Redis clock. Returns whether its info is still there (a Redis
# that restarted empty has lost it, and the worker must publish it again).
# KEYS: workers zset, worker info; ARGV: worker_id, offset ms (0 alive; negative marks it departed)
HEARTBEAT = _NOW + """
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return redis.call('EXISTS', KEYS[2])
"""

# Everything the API needs to know who serves what: {now, {id, score, ...}, {draining ids}}.
# KEYS: workers zset, draining set
WORKERS = _NOW + """
return {now, redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES'), redis.call('SMEMBERS', KEYS[2])}
"""

# What the janitor has to look at: executions held by dead workers, executions that were
# never started in time. Forgets workers that departed more than `memory` ms ago.
# KEYS: workers zset, queued zset, draining set
# ARGV: dead after ms, memory ms, running prefix, execution prefix, worker prefix
JANITOR_SCAN = _NOW + """
local held = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]))) do
  for _, e in ipairs(redis.call('SMEMBERS', ARGV[3] .. id)) do
    table.insert(held, id)
    table.insert(held, e)
    table.insert(held, redis.call('HGET', ARGV[4] .. e, 'tool') or '')
  end
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))) do
  if redis.call('SCARD', ARGV[3] .. id) == 0 then
    redis.call('DEL', ARGV[5] .. id)
    redis.call('ZREM', KEYS[1], id)
    redis.call('SREM', KEYS[3], id)
  end
end
local late = {}
for _, e in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 100)) do
  table.insert(late, e)
  table.insert(late, redis.call('HGET', ARGV[4] .. e, 'tool') or '')
end
return {held, late}
"""
