"""The queues of a group no worker serves any more (docs/architecture.md, section 3).

A group is the set of tool definitions its workers serve (``runtime.presence.group_of``), with a
queue and a wake list of its own in every partition: a deploy that changes a definition makes a
new group, and the old one's workers stop. What was queued to the old group and then settled by
someone else (CANCEL, EXPIRE_UNSTARTED) stays in its queue for a worker's claim to take out, and
none of its workers claims any more; its wake list keeps its tokens.

Each partition lists the groups whose queues it may hold (``keys.groups``): every HEARTBEAT marks
its worker's group there, before the worker is listed as alive, so a group is listed before any
call can be queued to it. A group no worker has marked for the janitor's memory (an hour, as for
a departed worker) is gone: the janitor takes out of its queue, a slice at a time, the entries no
worker could run any more (what a claim would drop: the execution settled, or gone), and once the
queue is empty, drops the wake list and forgets the group. An execution still queued there after an
hour with no worker (one put back when its worker died, REAP, whose start window is longer than
that, or whose REAP, by an older release, gave it none) has no worker left to take it: the
janitor settles it (``Verdicts.expire_abandoned``: ``TIMEOUT``, safe to run again, so a job's
attempt is tried again on the workers serving its tool now), and the group is looked at again
``RECHECK_S`` later, when its entry goes; one of its workers that comes back marks it again, and
nothing more is taken out or settled.
"""

from __future__ import annotations

from typing import NamedTuple

from redis.asyncio import Redis

from carmy_worker.store import jobs, keys
from carmy_worker.store.lua import ACCEPTED_WORK, NOW
from carmy_worker.store.scripts import Script, bind

# Entries of a gone group's queue read, and looked at by one FORGET_GROUP, at a time.
SLICE = 500
# A gone group whose queue still holds an execution that could run is looked at again this late.
RECHECK_S = 60
# Gone groups one partition's janitor scan hands over at most.
GONE_AT_ONCE = 10

# Lua for JANITOR_SCAN: the groups of the partition (`groups`, a key it declares) that no worker
# has marked since `memory` ms, and their marks: {group, mark, ...}.
GONE = f"""
local function gone(groups, memory)
  return redis.call('ZRANGEBYSCORE', groups, '-inf', '(' .. (now - memory), 'WITHSCORES', 'LIMIT', 0, {GONE_AT_ONCE})
end
"""

# One slice of a gone group's queue, while the group still has the mark the janitor found it gone
# with (-1 otherwise: one of its workers beat since, or another janitor got there first): each
# entry whose execution is settled or gone is taken out. With the last slice (ARGV[3] not ''), the
# group is forgotten if its queue is empty now, its wake list with it; else it is marked to be
# looked at again ARGV[3] ms from now. Returns {entries kept, 1 if the group was forgotten, and
# {execution id, tool, ...} of the kept ones still queued}: the janitor settles those
# (``Verdicts.expire_abandoned``), and the next look takes them out.
# KEYS: groups zset, queue, wake list, then the execution hash of each entry
# ARGV: group, its mark, '' or (last slice) the mark's offset from now, then the entries
FORGET_GROUP = Script("FORGET_GROUP", ACCEPTED_WORK + NOW + """
if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or -1) ~= tonumber(ARGV[2]) then return {-1, 0, {}} end
local kept, queued = 0, {}
for i = 4, #ARGV do
  local h = redis.call('HMGET', KEYS[i], 'state', 'tool')
  if h[1] and h[1] ~= 'done' then
    kept = kept + 1
    if h[1] == 'queued' then
      table.insert(queued, ARGV[i])
      table.insert(queued, h[2] or '')
    end
  else
    redis.call('ZREM', KEYS[2], ARGV[i])
  end
end
if ARGV[3] == '' then return {kept, 0, queued} end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[3])
  redis.call('ZREM', KEYS[1], ARGV[1])
  return {kept, 1, queued}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return {kept, 0, queued}
""")


class Groups:
    """FORGET_GROUP, slice by slice, for a janitor that forgets after ``memory_ms``."""

    def __init__(self, redis: Redis, *, memory_ms: int) -> None:
        self._redis = redis
        self._forget = bind(redis, FORGET_GROUP)
        # The mark that makes a group gone again RECHECK_S from now.
        self._again_ms = RECHECK_S * 1000 - memory_ms

    async def forget(self, group: str, partition: int, mark: bytes) -> Forgetting:
        """Take out of ``group``'s queue in ``partition`` what no worker could run, the group found
        gone with ``mark``: whether the group was forgotten (nothing left that could run), and the
        executions still queued there, (id, tool) each, for the janitor to settle."""
        queue = jobs.queue_name(group, partition)
        fixed = [keys.groups(partition), queue, jobs.wake_list(queue)]
        hashes = keys.execution_prefix(partition)  # a queue holds its partition's executions only
        start = 0
        stranded: list[tuple[str, str]] = []
        while True:
            entries = [e.decode() for e in await self._redis.zrange(queue, start, start + SLICE - 1)]
            last = len(entries) < SLICE
            kept, forgotten, queued = await self._forget(
                keys=[*fixed, *(hashes + e for e in entries)],
                args=[group, mark, self._again_ms if last else "", *entries])
            stranded += [(queued[i].decode(), queued[i + 1].decode()) for i in range(0, len(queued), 2)]
            if kept < 0 or last:
                return Forgetting(forgotten=bool(forgotten), stranded=stranded)
            start += kept


class Forgetting(NamedTuple):
    """What ``Groups.forget`` did: whether it forgot the group, and the executions still queued
    in its queue (id, tool), which no worker will take any more."""

    forgotten: bool
    stranded: list[tuple[str, str]]
