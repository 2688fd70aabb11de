"""Who serves: each worker's HEARTBEAT on Redis's clock, and the ``Roster`` (WORKERS) that the
API, the health check and the janitor judge liveness by.

Liveness is judged only on evidence gathered while someone could have written it. Every
HEARTBEAT, roster read and janitor scan marks Redis as watched (``keys.WATCH``); a gap of more than a
third of ``dead_after`` with no mark at all means Redis was down or restarted (or every process
was stopped), and nobody could heartbeat. For one ``dead_after`` after such a gap, a worker that
was alive when the gap began still counts as alive: it gets a full period to reassert itself
before anyone reaps its executions or answers ``NO_WORKERS`` for its tools.
"""

from __future__ import annotations

from typing import Any

import redis as sync_redis
from msgspec import Struct
from redis.asyncio import Redis

from carmy_worker.store import jobs, keys
from carmy_worker.store.lua import ACCEPTED_WORK, NOW
from carmy_worker.store.scripts import Script, bind, bind_sync

# cutoff(now, dead ms): a worker last seen before the returned instant is dead. Marks Redis
# watched now.
# KEYS[1] is the watch hash in every script that uses it.
CUTOFF = """
local function cutoff(now, dead_ms)
  local w = redis.call('HMGET', KEYS[1], 'seen', 'since', 'from')
  local seen, since, from = tonumber(w[1]), tonumber(w[2]), tonumber(w[3])
  if not seen then
    since, from = now, now
  elseif now - seen > dead_ms / 3 then
    since, from = now, seen
  end
  redis.call('HSET', KEYS[1], 'seen', now, 'since', since, 'from', from)
  if now - since >= dead_ms then return now - dead_ms end
  return math.min(from, now) - dead_ms
end
"""

# Marks the worker seen now (plus an offset: negative marks it departed) and checks what it
# believes it holds, claiming again what a Redis crash made it lose. Returns {whether the
# worker's info is still there (a Redis that restarted empty lost it); lost: executions it no
# longer holds (reaped while it was paused or cut off, or settled by someone else); unlocked:
# executions it holds whose tool lock went to another; strays: {id, attempt, tool} listed as
# running on this worker that it did not name (a CLAIM or SETTLE whose reply never came, or
# that Redis lost); orphans: {job, token} leases in its hash for jobs it does not have (a LEASE
# whose reply never came)}. The orphans a previous beat returned, passed back, are released if
# they still are: the job is free to be leased again at once.
# KEYS: watch, workers zset, worker info, running set, queued zset, leases hash
# ARGV: worker_id, offset ms, dead ms, execution prefix, record prefix, in-progress prefix,
#       n, then n × (exec_id, attempt, lock key or ''), m, then m job ids it has, then
#       (job, token) pairs to release
HEARTBEAT = Script("HEARTBEAT", ACCEPTED_WORK + NOW + CUTOFF + jobs.DUE_AGAIN + """
cutoff(now, tonumber(ARGV[3]))
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
local lost, unlocked, named, has = {}, {}, {}, {}
local i = 8
for _ = 1, tonumber(ARGV[7]) do
  local e, attempt, lock = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  i = i + 3
  named[e] = true
  local h = redis.call('HMGET', ARGV[4] .. e, 'attempt', 'worker', 'state', 'reaped')
  if h[1] and tonumber(h[1]) < tonumber(attempt) and h[3] == 'queued'
      and redis.call('EXISTS', ARGV[5] .. e) == 0 then
    -- A Redis crash took this worker's CLAIM with its last writes: claim it again, so its
    -- outcome can be recorded and a redelivery finds the attempt taken.
    -- (Its tool may have begun: a redelivery must not run a non-idempotent one again.)
    redis.call('HSET', ARGV[4] .. e, 'attempt', attempt, 'worker', ARGV[1], 'state', 'running',
               'began', attempt)
    redis.call('SADD', KEYS[4], e)
    redis.call('ZREM', KEYS[5], e)
    h = {attempt, ARGV[1], 'running', h[4]}
  end
  if h[1] ~= attempt or h[2] ~= ARGV[1] or h[3] ~= 'running' or h[4] == attempt then
    table.insert(lost, e)
  elseif lock ~= '' and redis.call('GET', lock) ~= e .. '/' .. attempt then
    table.insert(unlocked, e)
  end
end
local n_jobs = tonumber(ARGV[i])
for k = 1, n_jobs do has[ARGV[i + k]] = true end
i = i + n_jobs + 1
while i < #ARGV do
  local job, token = ARGV[i], ARGV[i + 1]
  i = i + 2
  if not has[job] and redis.call('HGET', KEYS[6], job) == token then
    redis.call('HDEL', KEYS[6], job)
    if redis.call('GET', ARGV[6] .. job) == token then
      redis.call('DEL', ARGV[6] .. job)
      local wake = redis.call('HGET', ARGV[4] .. job, 'wake')
      if wake then due_again(wake, job) end
    end
  end
end
local strays = {}
for _, e in ipairs(redis.call('SMEMBERS', KEYS[4])) do
  if not named[e] then
    local h = redis.call('HMGET', ARGV[4] .. e, 'attempt', 'tool')
    table.insert(strays, e)
    table.insert(strays, h[1] or '0')
    table.insert(strays, h[2] or '')
  end
end
local orphans = {}
local leases = redis.call('HGETALL', KEYS[6])
for k = 1, #leases, 2 do
  if not has[leases[k]] then
    table.insert(orphans, leases[k])
    table.insert(orphans, leases[k + 1])
  end
end
return {redis.call('EXISTS', KEYS[3]), lost, unlocked, strays, orphans}
""")

# Everything the API needs to know who serves what: {cutoff, {id, score, ...}, {draining ids}}.
# Reading the roster marks Redis watched too: a health check is evidence that Redis is up, and
# with every worker gone, nothing else may be watching any more.
# KEYS: watch, workers zset, draining set; ARGV: dead ms
WORKERS = Script("WORKERS", ACCEPTED_WORK + NOW + CUTOFF + """
return {cutoff(now, tonumber(ARGV[1])), redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES'),
        redis.call('SMEMBERS', KEYS[3])}
""")


# A worker's info (REGISTER) and its drain (DRAIN), written over a full Redis's maxmemory like the
# work it serves: a worker that starts, or restarts, while Redis is full must still come up and
# serve the work already queued. (Each is announced on the catalog channel after it: PUBLISH is
# never refused for memory.)
# KEYS: the worker's info key; ARGV: its WorkerInfo (msgpack)
REGISTER = Script("REGISTER", ACCEPTED_WORK + "redis.call('SET', KEYS[1], ARGV[1]) return 1")
# KEYS: the draining set; ARGV: worker_id
DRAIN = Script("DRAIN", ACCEPTED_WORK + "return redis.call('SADD', KEYS[1], ARGV[1])")


class Roster(Struct, frozen=True):
    """Who heartbeats, as of Redis's clock: a worker last seen before ``cutoff`` (ms) is dead."""

    cutoff: int
    last_seen: dict[str, float]
    draining: frozenset[str]

    @classmethod
    def parse(cls, reply: list[Any]) -> Roster:
        pairs = reply[1]
        return cls(
            cutoff=int(reply[0]),
            last_seen={pairs[i].decode(): float(pairs[i + 1]) for i in range(0, len(pairs), 2)},
            draining=frozenset(w.decode() for w in reply[2]),
        )

    def alive(self, worker_id: str) -> bool:
        return self.last_seen.get(worker_id, 0) >= self.cutoff

    def serving(self, worker_id: str) -> bool:
        """Alive and taking new work."""
        return worker_id not in self.draining and self.alive(worker_id)


class Holding(Struct, frozen=True):
    """An execution a worker believes it runs: the attempt it claimed, and the lock it holds
    (``parallel_safe=False`` tools), whose value is ``lock_holder(execution_id, attempt)``."""

    execution_id: str
    attempt: int
    lock: str = ""


def lock_holder(exec_id: str, attempt: int) -> str:
    """The value of a tool's lock while one attempt of an execution holds it."""
    return f"{exec_id}/{attempt}"


class Stray(Struct, frozen=True):
    """An execution listed as running on a worker that did not name it in its heartbeat."""

    execution_id: str
    attempt: int
    tool: str


class Orphan(Struct, frozen=True):
    """A lease in a worker's hash for a job the worker does not have."""

    job_id: str
    token: str


class Beat(Struct, frozen=True):
    registered: bool  # False: Redis lost the worker's info, publish it again
    lost: list[str]  # executions of ``held`` this worker no longer holds
    unlocked: list[str]  # executions of ``held`` whose tool lock went to another
    strays: list[Stray]
    orphans: list[Orphan]


class Claims(Struct, frozen=True):
    """What a worker tells its heartbeat it has: the attempts it runs, the jobs it leased (as
    arq tasks), and the orphaned leases the previous beat found, to release if they still are."""

    held: list[Holding] = []
    jobs: list[str] = []
    release: list[Orphan] = []


NOTHING = Claims()


def _heartbeat_args(worker_id: str, offset_ms: int, dead_ms: int, claims: Claims) -> list[str | int]:
    args: list[str | int] = [worker_id, offset_ms, dead_ms, keys.execution(""), keys.record(""),
                             jobs.in_progress_key_prefix(0), len(claims.held)]
    for h in claims.held:
        args += [h.execution_id, h.attempt, h.lock]
    args += [len(claims.jobs), *claims.jobs]
    for orphan in claims.release:
        args += [orphan.job_id, orphan.token]
    return args


def _beat(reply: list[Any]) -> Beat:
    strays = [v.decode() for v in reply[3]]
    orphans = [v.decode() for v in reply[4]]
    return Beat(
        registered=bool(reply[0]), lost=[e.decode() for e in reply[1]], unlocked=[e.decode() for e in reply[2]],
        strays=[Stray(strays[i], int(strays[i + 1]), strays[i + 2]) for i in range(0, len(strays), 3)],
        orphans=[Orphan(orphans[i], orphans[i + 1]) for i in range(0, len(orphans), 2)],
    )


def _heartbeat_keys(worker_id: str) -> list[str]:
    return [keys.WATCH, keys.WORKERS, keys.worker(worker_id), keys.running(worker_id, 0), keys.QUEUED,
            keys.leases(worker_id, 0)]


_ROSTER_KEYS = [keys.WATCH, keys.WORKERS, keys.DRAINING]


class Liveness:
    """HEARTBEAT and WORKERS (and a worker's REGISTER and DRAIN) on an asyncio client, for workers
    judged dead after ``dead_after`` s."""

    def __init__(self, redis: Redis, *, dead_after: float) -> None:
        self._heartbeat = bind(redis, HEARTBEAT)
        self._workers = bind(redis, WORKERS)
        self._register = bind(redis, REGISTER)
        self._drain = bind(redis, DRAIN)
        self.dead_ms = int(dead_after * 1000)

    async def register(self, worker_id: str, info: bytes) -> None:
        """Write ``worker_id``'s info (a msgpack ``WorkerInfo``), which the catalog reads."""
        await self._register(keys=[keys.worker(worker_id)], args=[info])

    async def drain(self, worker_id: str) -> None:
        """List ``worker_id`` as draining: it takes no new work."""
        await self._drain(keys=[keys.DRAINING], args=[worker_id])

    async def heartbeat(self, worker_id: str, *, offset_ms: int = 0, claims: Claims = NOTHING) -> Beat:
        """Mark ``worker_id`` seen now (plus ``offset_ms``), and check its ``claims``."""
        return _beat(await self._heartbeat(keys=_heartbeat_keys(worker_id),
                                           args=_heartbeat_args(worker_id, offset_ms, self.dead_ms, claims)))

    async def roster(self) -> Roster:
        return Roster.parse(await self._workers(keys=_ROSTER_KEYS, args=[self.dead_ms]))


class SyncLiveness:
    """The same on a blocking client: for the heartbeat thread and the container health check."""

    def __init__(self, redis: sync_redis.Redis, *, dead_after: float) -> None:
        self._heartbeat = bind_sync(redis, HEARTBEAT)
        self._workers = bind_sync(redis, WORKERS)
        self._register = bind_sync(redis, REGISTER)
        self.dead_ms = int(dead_after * 1000)

    def register(self, worker_id: str, info: bytes) -> None:
        self._register(keys=[keys.worker(worker_id)], args=[info])

    def heartbeat(self, worker_id: str, *, offset_ms: int = 0, claims: Claims = NOTHING) -> Beat:
        return _beat(self._heartbeat(keys=_heartbeat_keys(worker_id),
                                     args=_heartbeat_args(worker_id, offset_ms, self.dead_ms, claims)))

    def roster(self) -> Roster:
        return Roster.parse(self._workers(keys=_ROSTER_KEYS, args=[self.dead_ms]))


async def worker_infos(redis: Redis, worker_ids: list[str]) -> dict[str, bytes]:
    """The infos (msgpack ``WorkerInfo``, as REGISTER wrote them) of those of ``worker_ids``
    that have one."""
    raws = await redis.mget([keys.worker(w) for w in worker_ids])
    return {worker_id: raw for worker_id, raw in zip(worker_ids, raws, strict=True) if raw is not None}
