"""Who serves: each worker's HEARTBEAT on Redis's clock, and the ``Roster`` (WORKERS) that the
API, the health check and the janitor judge liveness by.

The roster is kept per partition (docs/architecture.md, section 3): a worker beats in every
partition's ``workers`` zset, and each beat checks what it holds in that partition, so that a
partition's janitor judges the workers, and reaps their work, with that partition's keys alone
(one slot: a Redis Cluster runs each partition's scripts on its own primary). A worker is dead
in a partition only by that partition's roster. Its info (``keys.worker``) is partition 0's, as
is the roster the catalog reads.

Liveness is judged only on evidence gathered while someone could have written it. Every
HEARTBEAT, roster read and janitor scan marks its partition as watched (``keys.watch``); a gap of
more than a third of ``dead_after`` with no mark at all means Redis was down or restarted (or
every process was stopped), and nobody could heartbeat. For one ``dead_after`` after such a gap,
a worker that was alive when the gap began still counts as alive: it gets a full period to
reassert itself before anyone reaps its executions or answers ``NO_WORKERS`` for its tools.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import redis as sync_redis
from msgspec import Struct
from redis.asyncio import Redis

from carmy_worker.store import jobs, keys
from carmy_worker.store.fanout import (
    Call,
    ReloadAside,
    reload_slots,
    run_each,
    run_each_by_node_sync,
    run_each_sync,
)
from carmy_worker.store.lua import ACCEPTED_WORK, NOW
from carmy_worker.store.scripts import Script, bind, bind_sync, several_nodes

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

# The members of the running set (or leases) one scan part of a heartbeat looks at: about 0.5 ms
# of Redis's time (SSCAN and SMISMEMBER of a thousand).
SCAN_SLICE = 1000

# Marks the worker seen now in one partition (plus an offset: negative marks it departed) and
# checks what it holds there, in one of two ways.
#
# A full check (parts 'whole', 'first', 'more', 'scan', 'last': the worker names every execution and job
# it holds) compares each execution with its hash, claiming again what a Redis crash made it
# lose. Returns {whether the worker's info is still there (a Redis that restarted empty lost it;
# 1 when the info key is not declared: it is partition 0's alone); lost: executions it no longer
# holds (reaped while it was paused or cut off, or settled by someone else); strays: {id, attempt,
# tool} listed as running on this worker that it did not name (a CLAIM or SETTLE whose reply never
# came, or that Redis lost); orphans: {job, token} leases in its hash for jobs it does not have (a
# LEASE whose reply never came); the epoch}. The orphans a previous beat returned, passed back,
# are released if they still are: the job is free to be leased again at once. It costs Redis
# about 4 us per execution held.
#
# The epoch is the serving Redis's run id and replication id (INFO): either changes when Redis
# restarts or another node is promoted, which are the only ways a write it acknowledged can be
# lost (the project requires `noeviction`). Part 'losses' (ARGV[9]: the epoch of the worker's last
# full check there) checks only what was taken from the worker since: every script that takes a
# running execution from its worker marks it in the worker's set of losses in the same script
# (lua.LOSE), so while the epoch is the same, that set holds every loss, and the beat reads it
# and drains it: {registered, {id, attempt, worker, state, reaped for each}, {}, {}, epoch}, and
# the worker compares them with what it holds, as the full check would have. With another epoch
# it reads nothing ({registered, {}, {}, {}, epoch}) and the worker sends a full check at once.
# A full check drains the set too (its first part), before it reads any hash. Strays and
# orphans come only from a reply that never came or a write Redis lost, so only full checks look
# for them: the worker sends one every few beats, and after any sign of either (presence.py).
#
# Every key is the partition's: the declared ones, and the executions, records and arq keys
# named from its prefixes (ARGV), in its slot. (A tool lock lives in a slot of its own:
# ``Liveness`` reads it beside the beat.)
#
# A worker holding more than ``BEAT_SLICE`` executions (or jobs) in the partition checks them in
# parts, each a round trip of its own (``_heartbeat_rounds``), so that no one script, nor one
# pipeline of them, holds Redis for long: a script holds every other client, and one over 10,000
# executions took 35-40 ms. Part 'first' marks the
# worker seen and checks a slice of what it holds, 'more' the next slices; each adds the names
# it was given to two sets of the beat's own (named, has). Then each part 'scan' takes one step
# (SSCAN, HSCAN of ``SCAN_SLICE``, from the cursors kept in the beat's scan hash) through the
# worker's running set, then its leases, and returns the strays and orphans of that step (one
# SMISMEMBER against named or has): finding them over 10,000 executions in one script (SDIFF,
# HKEYS) held Redis 12 ms. Part 'last' takes whatever steps are left (the worker sends as many
# scans as its own count says are needed; a running set grown since needs more), releases, and
# drops the beat's keys. A scan may return a member twice (a set rehashed between steps): the
# worker counts each once. Part 'whole' does all of it in one script, with Lua tables.
# The parts that mark the worker seen also mark its group (ARGV[7], '' for none) seen in the
# partition's groups, which the janitor forgets an hour after the last of its workers
# (store.groups): a group's queues are known there before any call can be queued to it.
# KEYS: watch, workers zset, running set, queued zset, leases hash, named set, has set, losses set,
#       scan hash, groups zset[, worker info]
# ARGV: worker_id, offset ms, dead ms, execution prefix, record prefix, in-progress prefix, group, part,
#       then for 'losses' the epoch known; for 'scan' the slice, then (job, token) pairs to
#       release; for the others n, then n × (exec_id, attempt), m, then m job ids it has, then
#       for 'whole' (job, token) pairs to release, for 'last' the slice
HEARTBEAT = Script("HEARTBEAT", ACCEPTED_WORK + NOW + CUTOFF + jobs.DUE_AGAIN + """
local part = ARGV[8]
local whole = part == 'whole'
local function add_all(key, items)
  for s = 1, #items, 1000 do redis.call('SADD', key, unpack(items, s, math.min(s + 999, #items))) end
end
local function registered()
  if KEYS[11] then return redis.call('EXISTS', KEYS[11]) end
  return 1
end
-- Of items, those not in the set at key (by their index), in calls of 1,000 at most.
local function absent(key, items)
  local out = {}
  for s = 1, #items, 1000 do
    for k, member in ipairs(redis.call('SMISMEMBER', key, unpack(items, s, math.min(s + 999, #items)))) do
      if member == 0 then table.insert(out, s + k - 1) end
    end
  end
  return out
end
-- Releases the leases of the (job, token) pairs from ARGV[i] on whose job the worker does not
-- have (the orphans its last beat found) and that still hold that token: the job is free to be
-- leased again at once.
local function release(i, has_job)
  while i < #ARGV do
    local job, token = ARGV[i], ARGV[i + 1]
    i = i + 2
    if not has_job(job) and redis.call('HGET', KEYS[5], job) == token then
      redis.call('HDEL', KEYS[5], job)
      if redis.call('GET', ARGV[6] .. job) == token then
        redis.call('DEL', ARGV[6] .. job)
        local wake = redis.call('HGET', ARGV[4] .. job, 'wake')
        if wake then due_again(wake, job) end
      end
    end
  end
end
-- Adds e to the strays found: {id, attempt, tool}.
local function stray(strays, e)
  local h = redis.call('HMGET', ARGV[4] .. e, 'attempt', 'tool')
  table.insert(strays, e)
  table.insert(strays, h[1] or '0')
  table.insert(strays, h[2] or '')
end
-- One step of the scan through the running set (strays), or once that is done through the
-- leases (orphans); false when both are done.
local function scan_step(slice, strays, orphans)
  local at = redis.call('HMGET', KEYS[9], 'strays', 'orphans')
  if at[1] ~= 'done' then
    local step = redis.call('SSCAN', KEYS[3], at[1] or '0', 'COUNT', slice)
    local members = step[2]
    for _, k in ipairs(absent(KEYS[6], members)) do stray(strays, members[k]) end
    redis.call('HSET', KEYS[9], 'strays', step[1] == '0' and 'done' or step[1])
  elseif at[2] ~= 'done' then
    local step = redis.call('HSCAN', KEYS[5], at[2] or '0', 'COUNT', slice)
    local fields, flat = {}, step[2]  -- flat: job, token, job, token...
    for k = 1, #flat, 2 do table.insert(fields, flat[k]) end
    for _, k in ipairs(absent(KEYS[7], fields)) do
      table.insert(orphans, fields[k])
      table.insert(orphans, flat[2 * k])
    end
    redis.call('HSET', KEYS[9], 'orphans', step[1] == '0' and 'done' or step[1])
  else
    return false
  end
  redis.call('EXPIRE', KEYS[9], 60)
  return true
end
local epoch = ''
if whole or part == 'first' or part == 'losses' then
  cutoff(now, tonumber(ARGV[3]))
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
  if ARGV[7] ~= '' then redis.call('ZADD', KEYS[10], 'GT', now + tonumber(ARGV[2]), ARGV[7]) end
  local info = redis.call('INFO', 'server', 'replication')
  epoch = (string.match(info, 'run_id:(%x+)') or '') .. '/' .. (string.match(info, 'master_replid:(%x+)') or '')
end
if part == 'losses' then
  if epoch ~= ARGV[9] then return {registered(), {}, {}, {}, epoch} end
  local found = {}
  local ids = redis.call('SMEMBERS', KEYS[8])
  if #ids > 0 then redis.call('DEL', KEYS[8]) end
  for _, e in ipairs(ids) do
    local h = redis.call('HMGET', ARGV[4] .. e, 'attempt', 'worker', 'state', 'reaped')
    table.insert(found, e)
    for k = 1, 4 do table.insert(found, h[k] or '') end
  end
  return {registered(), found, {}, {}, epoch}
end
if part == 'scan' then
  release(10, function(job) return redis.call('SISMEMBER', KEYS[7], job) == 1 end)
  local strays, orphans = {}, {}
  scan_step(ARGV[9], strays, orphans)
  return {1, {}, strays, orphans, ''}
end
if whole or part == 'first' then redis.call('DEL', KEYS[8]) end
if part == 'first' then redis.call('UNLINK', KEYS[6], KEYS[7], KEYS[9]) end  -- what a beat cut short left
local lost, named, has, names = {}, {}, {}, {}
local i = 10
for _ = 1, tonumber(ARGV[9]) do
  local e, attempt = ARGV[i], ARGV[i + 1]
  i = i + 2
  if whole then named[e] = true else table.insert(names, e) end
  local h = redis.call('HMGET', ARGV[4] .. e, 'attempt', 'worker', 'state', 'reaped')
  if h[1] and tonumber(h[1]) < tonumber(attempt) and h[3] == 'queued'
      and redis.call('EXISTS', ARGV[5] .. e) == 0 then
    -- A Redis crash took this worker's CLAIM with its last writes: claim it again, so its
    -- outcome can be recorded and a redelivery finds the attempt taken.
    -- (Its tool may have begun: a redelivery must not run a non-idempotent one again.)
    redis.call('HSET', ARGV[4] .. e, 'attempt', attempt, 'worker', ARGV[1], 'state', 'running',
               'began', attempt)
    redis.call('SADD', KEYS[3], e)
    redis.call('ZREM', KEYS[4], e)
    h = {attempt, ARGV[1], 'running', h[4]}
  end
  if h[1] ~= attempt or h[2] ~= ARGV[1] or h[3] ~= 'running' or h[4] == attempt then
    table.insert(lost, e)
  end
end
local n_jobs = tonumber(ARGV[i])
if whole then
  for k = 1, n_jobs do has[ARGV[i + k]] = true end
elseif n_jobs > 0 then
  add_all(KEYS[7], {unpack(ARGV, i + 1, i + n_jobs)})
end
i = i + n_jobs + 1
if not whole then
  add_all(KEYS[6], names)
  if part ~= 'last' then
    redis.call('EXPIRE', KEYS[6], 60)  -- a beat cut short leaves nothing for long
    redis.call('EXPIRE', KEYS[7], 60)
    return {1, lost, {}, {}, epoch}
  end
end
local strays, orphans = {}, {}
if not whole then
  while scan_step(ARGV[i], strays, orphans) do end  -- the steps the scan parts did not take
  redis.call('UNLINK', KEYS[6], KEYS[7], KEYS[9])  -- freed off Redis's main thread when large
  return {registered(), lost, strays, orphans, epoch}
end
release(i, function(job) return has[job] end)
for _, e in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if not named[e] then stray(strays, e) end
end
local leases = redis.call('HGETALL', KEYS[5])
for k = 1, #leases, 2 do
  if not has[leases[k]] then
    table.insert(orphans, leases[k])
    table.insert(orphans, leases[k + 1])
  end
end
return {registered(), lost, strays, orphans, epoch}
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
# A worker writes its info after its first heartbeat (runtime.presence): whenever the info is there,
# the worker is in partition 0's roster, and the janitor forgets both an hour after it departed.
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
    # Per partition, the epoch of the Redis that served its beat (HEARTBEAT): a losses-only beat
    # there is exact while it stays the same.
    epochs: list[str] = []
    stale: bool = False  # a losses-only beat met another epoch somewhere: a full check is due now


class Claims(Struct, frozen=True):
    """What a worker tells its heartbeat it has: the attempts it runs, the jobs it leased (as
    arq tasks), and the orphaned leases the previous beat found, to release if they still are."""

    held: list[Holding] = []
    jobs: list[str] = []
    release: list[Orphan] = []


NOTHING = Claims()


# The most held executions (and, apart, jobs) one HEARTBEAT checks: past it a partition's beat
# is sent in parts (see the script), a round trip each. About 0.4 ms of Redis's time each
# (bench/README.md, "The full check in steps"): a call of another client waits behind one at most
# that long (at 500, 2-3 ms: beside 10,000 held executions every call during a full beat took 3-6 ms).
BEAT_SLICE = 100
# A cluster's beat goes to this many nodes at once at most (one thread each, kept by SyncLiveness).
MAX_NODE_SENDERS = 32


def _beat_keys(worker_id: str, partition: int, *, last: bool) -> list[str]:
    """HEARTBEAT's keys in ``partition``; the worker's info (partition 0's) only with its last call
    there, which alone says whether Redis lost it."""
    call_keys = [keys.watch(partition), keys.workers(partition), keys.running(worker_id, partition),
                 keys.queued(partition), keys.leases(worker_id, partition),
                 keys.beat_named(worker_id, partition), keys.beat_has(worker_id, partition),
                 keys.lost(worker_id, partition), keys.beat_scan(worker_id, partition), keys.groups(partition)]
    return [*call_keys, keys.worker(worker_id)] if last and partition == 0 else call_keys


def _beat_head(worker_id: str, offset_ms: int, dead_ms: int, partition: int, group: str) -> list[str | int]:
    return [worker_id, offset_ms, dead_ms, keys.execution_prefix(partition), keys.record_prefix(partition),
            jobs.in_progress_key_prefix(partition), group]


def _heartbeat_call(worker_id: str, offset_ms: int, dead_ms: int, held: list[Holding], has: list[str],
                    release: list[str | int], partition: int, group: str) -> Iterator[Call]:
    """HEARTBEAT's full check in ``partition``, given only that partition's executions held,
    jobs and orphans to release, in order: one call, or for a worker that holds more there its
    named parts (``BEAT_SLICE`` of each at most), its scan steps, then its last part. Each call
    is made when it is asked for (see ``_heartbeat_rounds``)."""
    head = _beat_head(worker_id, offset_ms, dead_ms, partition, group)
    last_keys = _beat_keys(worker_id, partition, last=True)
    if len(held) <= BEAT_SLICE and len(has) <= BEAT_SLICE:
        yield last_keys, [*head, "whole", *_held_and_jobs(held, has), *release]
        return
    call_keys = _beat_keys(worker_id, partition, last=False)
    size = max(BEAT_SLICE, 1)  # 0: every beat with something to check in parts (the tests' way to see them)
    for n in range(max(-(-len(held) // size), -(-len(has) // size))):
        yield call_keys, [*head, "first" if n == 0 else "more", *_held_and_jobs(
            held[n * size:(n + 1) * size], has[n * size:(n + 1) * size])]
    # As many scan steps as the running set and the leases take if they hold what the worker
    # named (at least one, which releases); the last part takes any step left.
    for n in range(max(1, -(-len(held) // SCAN_SLICE) + -(-len(has) // SCAN_SLICE))):
        yield call_keys, [*head, "scan", SCAN_SLICE, *(release if n == 0 else [])]
    yield last_keys, [*head, "last", 0, 0, SCAN_SLICE]


def _heartbeat_rounds(worker_id: str, offset_ms: int, dead_ms: int, claims: Claims,
                      group: str) -> Iterator[list[Call]]:
    """A full beat's calls over every partition, in rounds: each round's calls go out in one
    pipeline, once the round before has answered, and round n holds the n-th call of each
    partition (the first: its whole call, or its first part, which reads its epoch). Redis runs
    the calls a pipeline brings in one read back to back, and a client's pipeline of a beat's
    parts and scan steps held it as long as one script over all of them (25-34 ms at 10,000
    executions, PINGs of other clients waiting); one round trip per part lets it serve its other
    clients between any two.

    Each round is built when the one before has answered. The heartbeat thread holds the GIL
    while it builds: the whole beat's arguments, built before the first was sent (about 4 ms at
    10,000 executions, with the snapshot of what the worker holds), held the event loop as long,
    and longer once Python's switch interval (5 ms) came into it; built a round at a time, each
    round trip lets the loop in."""
    partitions = keys.partitions()
    held: dict[int, list[Holding]] = {p: [] for p in partitions}
    has: dict[int, list[str]] = {p: [] for p in partitions}
    release: dict[int, list[str | int]] = {p: [] for p in partitions}
    if len(partitions) == 1:  # everything is partition 0's
        held[0], has[0] = claims.held, claims.jobs
        for orphan in claims.release:
            release[0] += [orphan.job_id, orphan.token]
    else:
        mine = keys.partition_of
        for h in claims.held:
            held[mine(h.execution_id)].append(h)
        for job in claims.jobs:
            has[mine(job)].append(job)
        for orphan in claims.release:
            release[mine(orphan.job_id)] += [orphan.job_id, orphan.token]
    pending = [_heartbeat_call(worker_id, offset_ms, dead_ms, held[p], has[p], release[p], p, group)
               for p in partitions]
    while pending:
        calls = [(call, partition) for partition in pending if (call := next(partition, None)) is not None]
        if not calls:
            return
        yield [call for call, _ in calls]
        pending = [partition for _, partition in calls]


def _losses_calls(worker_id: str, dead_ms: int, epochs: list[str], group: str) -> list[Call]:
    """HEARTBEAT's losses-only check, one call per partition, each with the epoch of the worker's
    last full check there."""
    return [(_beat_keys(worker_id, p, last=True), [*_beat_head(worker_id, 0, dead_ms, p, group), "losses", epochs[p]])
            for p in keys.partitions()]


def _held_and_jobs(held: list[Holding], has: list[str]) -> list[str | int]:
    args: list[str | int] = [len(held)]
    for h in held:
        args += [h.execution_id, h.attempt]
    return [*args, len(has), *has]


def _read_locks(claims: Claims) -> Callable[[Any], None]:
    """Asks a pipeline for the value of each lock the claims hold (each in a slot of its own)."""
    def read(pipe: Any) -> None:
        for h in claims.held:
            if h.lock:
                pipe.get(h.lock)
    return read


def _unlocked(claims: Claims, locks: list[Any], gone: set[str]) -> list[str]:
    """The held executions not lost whose lock's value is not their attempt's."""
    values = iter(locks)
    return [h.execution_id for h in claims.held
            if h.lock and next(values) != lock_holder(h.execution_id, h.attempt).encode()
            and h.execution_id not in gone]


def _beat(claims: Claims, replies: list[Any], locks: list[Any]) -> Beat:
    """One full beat over every partition (each in one call, or in parts): partition 0's last
    says whether the info is there (every other answers 1); the lost, strays and orphans of all;
    each partition's epoch, from its first call (the only one of its calls that reads it)."""
    lost = [e.decode() for reply in replies for e in reply[1]]
    found = [v.decode() for reply in replies for v in reply[2]]
    strays = {found[i]: Stray(found[i], int(found[i + 1]), found[i + 2]) for i in range(0, len(found), 3)}
    found = [v.decode() for reply in replies for v in reply[3]]
    orphans = {found[i]: Orphan(found[i], found[i + 1]) for i in range(0, len(found), 2)}
    return Beat(  # a scan may name one twice (see the script): each counts once
        registered=all(reply[0] for reply in replies), lost=lost, unlocked=_unlocked(claims, locks, set(lost)),
        strays=list(strays.values()), orphans=list(orphans.values()),
        epochs=[reply[4].decode() for reply in replies if reply[4]],
    )


def _losses_beat(worker_id: str, epochs: list[str], locked: Claims, replies: list[Any], locks: list[Any],
                 attempt_of: Callable[[str], int | None]) -> Beat:
    """One losses-only beat over every partition: of the executions taken from the worker since
    the last beat, those it still holds by ``attempt_of`` (its attempt, or None) are lost unless
    their hash says otherwise (HEARTBEAT's own test, on the fields the script read)."""
    lost = []
    for reply in replies:
        found = [v.decode() for v in reply[1]]
        for i in range(0, len(found), 5):
            exec_id, attempt, worker, state, reaped = found[i:i + 5]
            held = attempt_of(exec_id)
            if held is not None and (attempt != str(held) or worker != worker_id or state != "running"
                                     or reaped == str(held)):
                lost.append(exec_id)
    seen = [reply[4].decode() for reply in replies]
    return Beat(registered=all(reply[0] for reply in replies), lost=lost, unlocked=_unlocked(locked, locks, set(lost)),
                strays=[], orphans=[], epochs=seen, stale=seen != epochs)


def _roster_call(dead_ms: int, partition: int) -> Call:
    return [keys.watch(partition), keys.workers(partition), keys.draining(partition)], [dead_ms]


def _drain_call(worker_id: str, partition: int) -> Call:
    return [keys.draining(partition)], [worker_id]


def _departed(worker_id: str) -> Callable[[Any], None]:
    """Asks a pipeline to take ``worker_id`` off every partition's draining set."""
    def forget(pipe: Any) -> None:
        for partition in keys.partitions():
            pipe.srem(keys.draining(partition), worker_id)
    return forget


class Liveness:
    """HEARTBEAT and WORKERS (and a worker's REGISTER and DRAIN) on an asyncio client, for workers
    judged dead after ``dead_after`` s. A worker beats, drains and departs in every partition at
    once (``store.fanout``: one pipeline; a full beat of many executions, one per round of its
    parts: ``_heartbeat_rounds``); its info is partition 0's, and so is the roster the
    catalog reads."""

    def __init__(self, redis: Redis, *, dead_after: float, group: str = "") -> None:
        self.redis = redis
        self._workers = bind(redis, WORKERS)
        self._register = bind(redis, REGISTER)
        self.dead_ms = int(dead_after * 1000)
        self.group = group  # the group of the workers it beats for, marked seen with them ('' for none)

    async def register(self, worker_id: str, info: bytes) -> None:
        """Write ``worker_id``'s info (a msgpack ``WorkerInfo``), which the catalog reads."""
        await self._register(keys=[keys.worker(worker_id)], args=[info])

    async def drain(self, worker_id: str) -> None:
        """List ``worker_id`` as draining in every partition: it takes no new work."""
        await run_each(self.redis, DRAIN, [_drain_call(worker_id, p) for p in keys.partitions()])

    async def heartbeat(self, worker_id: str, *, offset_ms: int = 0, claims: Claims = NOTHING) -> Beat:
        """Mark ``worker_id`` seen now (plus ``offset_ms``) in every partition, and check its ``claims``."""
        replies: list[Any] = []
        locks: list[Any] = []
        for n, calls in enumerate(_heartbeat_rounds(worker_id, offset_ms, self.dead_ms, claims, self.group)):
            answered, read = await run_each(self.redis, HEARTBEAT, calls, then=_read_locks(claims) if n == 0 else None)
            replies += answered
            locks += read
        return _beat(claims, replies, locks)

    async def depart(self, worker_id: str) -> None:
        """Mark ``worker_id`` departed in every partition (its tools are remembered a while, as
        unavailable), and no longer draining."""
        # Nothing held: one round. (The group keeps its mark: GT, and another of its workers may beat.)
        (calls,) = _heartbeat_rounds(worker_id, -self.dead_ms - 1, self.dead_ms, NOTHING, self.group)
        await run_each(self.redis, HEARTBEAT, calls, then=_departed(worker_id))

    async def roster(self, partition: int) -> Roster:
        """Who heartbeats, as ``partition`` knows it (partition 0's: the catalog's)."""
        return Roster.parse(await self._workers(*_roster_call(self.dead_ms, partition)))

    async def rosters(self) -> list[Roster]:
        """Every partition's roster, in order, in one round trip."""
        replies, _ = await run_each(self.redis, WORKERS, [_roster_call(self.dead_ms, p) for p in keys.partitions()])
        return [Roster.parse(reply) for reply in replies]


class SyncLiveness:
    """The same on a blocking client: for the heartbeat thread, ``Presence.ensure_fresh`` and the
    container health check. On a cluster, after a node failed, the slot table is reloaded before
    a beat returns (the heartbeat thread's next beat goes where the slots are now) or, with
    ``reload_aside``, in a thread of its own (``fanout.ReloadAside``: the check every async tool's
    next step waits for must not wait on seeds that hang)."""

    def __init__(self, redis: sync_redis.Redis, *, dead_after: float, reload_aside: bool = False,
                 group: str = "") -> None:
        self.redis = redis
        self._reload: Callable[[Collection[str]], None] = (
            ReloadAside(redis) if reload_aside else functools.partial(reload_slots, redis))
        self._register = bind_sync(redis, REGISTER)
        self.dead_ms = int(dead_after * 1000)
        self.group = group
        self._senders: ThreadPoolExecutor | None = None  # a cluster's beat: a thread per node, kept

    def _node_senders(self) -> ThreadPoolExecutor:
        """The threads that send a cluster's beat to its nodes at once, made on the first beat and
        kept: a beat a second need not start and join a thread per node each time. (Threads are
        started as needed, up to the bound: a cluster of more primaries than that sends in turns.)"""
        if self._senders is None:
            self._senders = ThreadPoolExecutor(MAX_NODE_SENDERS, thread_name_prefix="carmy-beat")
        return self._senders

    def register(self, worker_id: str, info: bytes) -> None:
        self._register(keys=[keys.worker(worker_id)], args=[info])

    def connect(self) -> None:
        """Connect now rather than on the first beat: a cluster client is made and loads its slot
        table (the seeds asked in turn, each that hangs for its timeout), a Sentinel client finds
        its primary. For a caller whose beats must not wait on that (``Presence.ensure_fresh``,
        whose check every async tool's next step waits for). Raises ``RedisError`` if nothing
        answers: the first beat tries again."""
        if several_nodes(self.redis):
            cast(Any, self.redis).get_nodes()  # a LazySyncCluster: made, its table loaded
        else:
            self.redis.ping()

    def heartbeat(self, worker_id: str, *, offset_ms: int = 0, claims: Claims = NOTHING) -> Beat:
        """Mark ``worker_id`` seen now in every partition, and check its ``claims``. On a cluster
        with a node unreachable (a primary killed, its replica not yet promoted) the beat still
        lands in every partition whose primary answers, and then raises the node's error: else a
        failover of one primary would leave every worker unseen for seconds in the partitions
        of the others, which watch all along, and their janitors would reap the executions those
        live workers run (``EXECUTION_UNCERTAIN`` for a non-idempotent tool that began)."""
        replies, locks = self._send(_heartbeat_rounds(worker_id, offset_ms, self.dead_ms, claims, self.group), claims)
        return _beat(claims, replies, locks)

    def check_losses(self, worker_id: str, *, epochs: list[str], locked: list[Holding],
                     attempt_of: Callable[[str], int | None]) -> Beat:
        """Mark ``worker_id`` seen now in every partition, and check only what was taken from it
        since its last beat (HEARTBEAT's part 'losses'): exact while each partition's Redis is of
        the epoch in ``epochs`` (that of the worker's last full check there), and ``stale``
        otherwise, when the caller must send a full check (``heartbeat``). ``locked``: the
        holdings that hold a tool lock, whose locks are read as a full beat reads them;
        ``attempt_of``: the attempt the worker holds at an execution, or None."""
        claims = Claims(held=locked)
        replies, locks = self._send([_losses_calls(worker_id, self.dead_ms, epochs, self.group)], claims)
        return _losses_beat(worker_id, epochs, claims, replies, locks, attempt_of)

    def _send(self, rounds: Iterable[list[Call]], claims: Claims) -> tuple[list[Any], list[Any]]:
        """A beat's HEARTBEAT calls, round by round (``_heartbeat_rounds``), and with the first a
        GET of each lock ``claims`` hold: the calls' replies in order, and the GETs'."""
        replies: list[Any] = []
        locks: list[Any] = []
        if not several_nodes(self.redis):
            for n, calls in enumerate(rounds):
                answered, read = run_each_sync(self.redis, HEARTBEAT, calls,
                                               then=_read_locks(claims) if n == 0 else None)
                replies += answered
                locks += read
            return replies, locks
        # One pipeline per node, all at once (``fanout.run_each_by_node_sync``): a node that
        # refuses or hangs costs its own partitions their beat, not the others'. A cluster
        # pipeline did not write to any node while a hung one held its handshake: a worker
        # went unseen everywhere, was judged dead, and what it ran was run again elsewhere.
        # A partition whose call failed sends none of its later rounds (a hung node would make
        # each of them wait out the timeout again).
        failed: dict[str, Exception] = {}  # by the partition's first key
        unreached: set[str] = set()  # the nodes that failed
        for n, calls in enumerate(rounds):
            calls = [call for call in calls if call[0][0] not in failed]
            if not calls:
                continue
            answered, read = run_each_by_node_sync(self.redis, HEARTBEAT, calls,
                                                   then=_read_locks(claims) if n == 0 else None,
                                                   pool=self._node_senders(), unreached=unreached)
            for (call_keys, _), reply in zip(calls, answered, strict=True):
                if isinstance(reply, Exception):
                    failed.setdefault(call_keys[0], reply)
            replies += answered
            locks += read
        # The slot table is reloaded once the rounds are done, not between two of them, and
        # before the next beat, which goes where the slots are now (a promoted replica); with
        # ``reload_aside``, in a thread, and the next check goes there once it is done.
        self._reload(unreached)
        for reply in (*failed.values(), *locks):
            if isinstance(reply, Exception):  # that node's partitions went unbeaten: say so
                raise reply
        return replies, locks

    def rosters(self) -> list[Roster]:
        replies, _ = run_each_sync(self.redis, WORKERS, [_roster_call(self.dead_ms, p) for p in keys.partitions()])
        return [Roster.parse(reply) for reply in replies]


async def worker_infos(redis: Redis, worker_ids: list[str]) -> dict[str, bytes]:
    """The infos (msgpack ``WorkerInfo``, as REGISTER wrote them) of those of ``worker_ids``
    that have one."""
    raws = await redis.mget([keys.worker(w) for w in worker_ids])
    return {worker_id: raw for worker_id, raw in zip(worker_ids, raws, strict=True) if raw is not None}
