"""What the Lua scripts share: Redis's clock, publishing an execution's events (``EMIT``), and
imposing a record over whoever holds an execution.

Every script of the store is called through one typed wrapper next to its source (named
parameters in, a typed result out); nothing else builds a script's ``KEYS`` or ``ARGV``.
"""

from __future__ import annotations

from carmy_worker.store import keys
from carmy_worker.store.metrics import LUA_COUNT

# Every script starts with one of these two lines (Redis 7 script flags), which say what it may
# do while Redis is over its `maxmemory` (`noeviction`): a script with flags but not
# `allow-oom` is refused whole, before it runs (an OOM error, nothing written). A script without
# flags would be refused only at its first write that may grow memory, and not at all if it wrote
# anything before (a ZREM will do): SUBMIT, whose first write prunes the admission set, went on
# accepting work past the limit while SETTLE, whose first write is the record, could not write it.
# NEW_WORK (SUBMIT only) takes new work in, and a full Redis refuses it. ACCEPTED_WORK (every
# other script: claims, records, verdicts, heartbeats, follows) carries on with work already
# accepted, and runs over the limit, so that accepted work settles (store/memory.py says how
# admission keeps room for it: docs/architecture.md, "A full Redis").
# READS_ONLY (the API's STATES) writes nothing, which Redis checks, and runs whatever the memory.
NEW_WORK = "#!lua\n"
ACCEPTED_WORK = "#!lua flags=allow-oom\n"
READS_ONLY = "#!lua flags=no-writes\n"

# Time comes from Redis, so API and worker clocks never have to agree.
# A number a script passes to redis.call more than once, or often, goes as `int(n)`, made a
# string once: Redis 7.0 formats every Lua number argument with snprintf('%.17g'), which costs
# more than '%d' here (and than the command itself, for most of ours). What is already a string
# (an ARGV) goes as it is.
NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function int(n) return string.format('%d', n) end
"""

# Lua: whether an attempt still holds its execution, from HOLDING's fields of its hash (read
# first, in that order): it is the current attempt, not reaped, running (so no record yet: what
# writes one sets `done`), on this worker. HOLDS and PROGRESS ask it; HEARTBEAT asks the same in a
# read of its own (more fields, in another order). SETTLE asks less on purpose: it also writes
# the verdict of a claim that never ran the tool (cancelled, uncertain, expired), which counts the
# attempt without marking it `running` on the worker (attempts.CLAIM_ONE).
HOLDING = "'attempt', 'reaped', 'state', 'worker'"
HELD = """
local function held(h, attempt, worker_id)
  return h[1] == attempt and h[2] ~= attempt and h[3] == 'running' and h[4] == worker_id
end
"""

# Lua: marks an execution lost by the worker that ran it, in that worker's set of its partition
# (keys.lost, named in the same slot as the execution: `lost_key` builds it from the execution's
# hash). Every script that takes a running execution from its worker calls it, in the same script
# as the change (REAP; a claim of an execution listed as running elsewhere), so that the worker's
# next heartbeat finds the loss by reading that set rather than every execution it holds
# (store.roster). An hour's TTL from the last mark: a worker that never beats again leaves nothing.
LOSE = f"""
local function lost_key(exe, exec_id, worker_id)
  return string.sub(exe, 1, #exe - #exec_id - {len(keys.EXECUTION)}) .. '{keys.LOST}' .. worker_id
end
local function lose(key, exec_id)
  redis.call('SADD', key, exec_id)
  redis.call('EXPIRE', key, 3600)
end
"""

# Publishes one of an execution's events to whoever follows it; every script that publishes an
# event goes through it. The API processes' channels are sharded (SPUBLISH): each is named in the
# execution's partition (keys.api_channel), so a message stays on the shard of the script's slot
# instead of being broadcast to every node of a cluster. SUBMIT records in the execution's hash
# where its events go: `reply`, the channel of the API process that holds the caller, and `stream`
# ('1' when someone relays every event); JOIN (store/follow.py) adds the channels of later followers to `joined` (space
# separated). On those channels a message is the execution id, a space, then the event, so that
# one subscription per API process serves all its executions. A caller that only wants the answer
# (JSON) gets only the `final` event: `tool.started`/`progress`/`completed` are not published at
# all unless `stream` is set. An execution submitted by an API of before (no `reply` field) gets
# every event on its own channel (keys.events), as it did then.
# A script that reads the execution's hash anyway reads FOLLOWERS with it and calls `emit_to`
# (and, to skip building an event nobody gets, `emits`); `emit` reads them itself.
FOLLOWERS = "'reply', 'joined', 'stream'"
EMIT = f"""
local function emits(f, final) return final or not f[1] or f[3] == '1' end
local function emit_to(f, exec_id, channel, event, final)
  if not f[1] then redis.call('PUBLISH', channel, event) end
  if not final and f[3] ~= '1' then return end
  local message = exec_id .. ' ' .. event
  if f[1] then redis.call('SPUBLISH', f[1], message) end
  if f[2] then
    for follower in string.gmatch(f[2], '%S+') do
      if follower ~= f[1] then redis.call('SPUBLISH', follower, message) end
    end
  end
end
local function emit(exe, exec_id, channel, event, final)
  emit_to(redis.call('HMGET', exe, {FOLLOWERS}), exec_id, channel, event, final)
end
"""

# audit(stream, exe, exec_id, now, label, run_ms, replay_via) appends to `stream`, the audit
# stream of the execution's partition (keys.audit: in the script's slot), the entry of the
# execution `exe` describes, its tool, status and error code taken from the record's metrics
# label (store.metrics.label), `run_ms` its tool's run time ('' if unknown). With `replay_via`
# (the door of the retry), the entry is of a replay. A missing field is written ''.
# A script that reads the execution's hash anyway (SETTLE) reads AUDITED with it, in that order,
# and calls `audit_from` with those values: one HMGET for both.
# Every entry has the same fields in the same order: entries of the same fields share their
# names in the stream's nodes (Redis stores them once per node, not once per entry).
AUDITED = "'rid', 'job', 'principal', 'effect', 'via', 'worker', 'queued_at', 'started_at'"
LUA_AUDIT = f"""
local function audit_from(stream, a, exec_id, now, label, run_ms, replay_via)
  local tool, status, code = string.match(label, '^(.*)\\31([^\\31]*)\\31(.*)$')
  local via, replayed = a[5] or '', ''
  if replay_via ~= '' then via, replayed = replay_via, '1' end
  redis.call('XADD', stream, '*', 'execution_id', exec_id, 'request_id', a[1] or '', 'job_id', a[2] or '',
             'principal', a[3] or '', 'tool', tool or '', 'effect', a[4] or '', 'status', status or '',
             'error_code', code or '', 'duration_ms', run_ms, 'queued_at', a[7] or '', 'started_at', a[8] or '',
             'finished_at', now, 'replayed', replayed, 'via', via, 'worker', a[6] or '')
end
local function audit(stream, exe, exec_id, now, label, run_ms, replay_via)
  audit_from(stream, redis.call('HMGET', exe, {AUDITED}), exec_id, now, label, run_ms, replay_via)
end
"""

# Writes a record in place of whoever holds the execution (the janitor, a cancel): bumping the
# attempt fences out a late writer of the old one. It frees the execution's admission slot, and
# its principal's (the pending set its hash names in `quota`: store/quota.py), as SETTLE does,
# and lists an execution of a job in `settled` (its partition's, keys.jobs_settled) for the job loop, and appends
# the execution's audit entry to `trail` (its partition's stream, keys.audit), as SETTLE does;
# `counts` is its partition's count of records (metrics.executions).
IMPOSE = LUA_COUNT + EMIT + LUA_AUDIT + """
local function impose(exe, rec, pending, exec_id, stored, retention, channel, final, label, settled, trail, counts)
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('HINCRBY', exe, 'attempt', 1)
  redis.call('SET', rec, stored, 'EX', tonumber(retention))
  redis.call('HSET', exe, 'state', 'done', 'ended_at', ms)
  redis.call('ZREM', pending, exec_id)
  local owned = redis.call('HMGET', exe, 'quota', 'job')
  if owned[1] then redis.call('ZREM', owned[1], exec_id) end
  if owned[2] then redis.call('ZADD', settled, ms, exec_id) end
  emit(exe, exec_id, channel, final, true)
  count(counts, label)
  audit(trail, exe, exec_id, ms, label, '', '')
end
"""


def text(reply: bytes | str) -> str:
    """A status string a script returned (bytes from a client without decode_responses)."""
    return reply.decode() if isinstance(reply, bytes) else reply
