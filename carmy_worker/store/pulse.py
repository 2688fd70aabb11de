"""The pulse of the deployment: everything the console's live overview shows of Redis, read in
one round trip, once a second, by each API process (``api/console/live.py``), however many
people watch.

PULSE runs in every partition (``store.fanout``: one pipeline, one round trip on one Redis) and
the parts are added up: the workers are partition 0's roster, judged by the roster's own rule
(``roster.CUTOFF``, which marks each partition watched, as WORKERS does: a reading is evidence
that Redis is up), each one's running executions counted in every partition, each queue's depth
over its partitions; the metrics hashes and the admission sets of every partition are read in
the same pipeline. A worker's info never changes while it lives, so PULSE sends it only for the
workers the caller does not know yet, and the depth only of the queues it names.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from msgspec import Struct
from redis.asyncio import Redis

from carmy_worker.store import jobs, keys, metrics
from carmy_worker.store.fanout import Call, run_each
from carmy_worker.store.lua import ACCEPTED_WORK, NOW
from carmy_worker.store.roster import CUTOFF, Roster
from carmy_worker.store.scripts import Script

# One partition's part of the pulse: its roster as WORKERS reads it, with each worker's running
# set there counted, the infos of the workers not named in `known` (partition 0's only: ARGV[3]
# is '' elsewhere), and each declared queue's due jobs (due now and not leased: LEASE moves a
# leased job's score to its lease's end) and length.
# KEYS: watch, workers zset, draining set, then the queues of the groups asked for
# ARGV: dead ms, running-set prefix, info prefix or '', n, then n known worker ids
PULSE = Script("PULSE", ACCEPTED_WORK + NOW + CUTOFF + """
local dead_before = cutoff(now, tonumber(ARGV[1]))
local roster = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
local n = tonumber(ARGV[4])
local known = {}
for i = 5, 4 + n do known[ARGV[i]] = true end
local busy, infos = {}, {}
for i = 1, #roster, 2 do
  local w = roster[i]
  table.insert(busy, redis.call('SCARD', ARGV[2] .. w))
  if ARGV[3] ~= '' and not known[w] then
    local info = redis.call('GET', ARGV[3] .. w)
    if info then
      table.insert(infos, w)
      table.insert(infos, info)
    end
  end
end
local queues = {}
for i = 4, #KEYS do
  table.insert(queues, redis.call('ZCOUNT', KEYS[i], '-inf', now))
  table.insert(queues, redis.call('ZCARD', KEYS[i]))
end
return {now, dead_before, roster, redis.call('SMEMBERS', KEYS[3]), busy, infos, queues}
""")


class QueueDepth(Struct, frozen=True):
    """One group's arq queue: the jobs ``due`` (waiting for a free slot) and its whole ``length``
    (leased and deferred jobs too)."""

    due: int
    length: int


class Pulse(Struct, frozen=True, kw_only=True):
    """One reading. ``now``: Redis's clock (ms). ``roster``: who heartbeats, judged as the
    catalog judges (``Roster.alive``). ``busy``: each listed worker's claimed executions.
    ``infos``: the ``WorkerInfo`` (msgpack) of each listed worker the caller did not know.
    ``queues``: the named groups' queues. ``queued`` and ``pending``: the executions accepted
    and not started, and those not yet settled. ``executions`` and ``run``: the metrics hashes
    as stored (``store.metrics``: field -> count)."""

    now: int
    roster: Roster
    busy: dict[str, int]
    infos: dict[str, bytes]
    queues: dict[str, QueueDepth]
    queued: int
    pending: int
    executions: dict[bytes, bytes]
    run: dict[bytes, bytes]


class PulseReader:
    """Reads a ``Pulse`` in one round trip, for workers judged dead after ``dead_after`` s."""

    def __init__(self, redis: Redis, *, dead_after: float) -> None:
        self.redis = redis
        self.dead_ms = int(dead_after * 1000)

    async def read(self, *, known: Collection[str] = (), groups: Sequence[str] = ()) -> Pulse:
        """The pulse now: infos only of the workers not in ``known``, depths of ``groups``' queues."""
        calls = [self._call(p, known, groups) for p in keys.partitions()]
        replies, reads = await run_each(self.redis, PULSE, calls, then=_read_metrics)
        executions, run_hist, _ = metrics.added_counts(reads)
        queued, pending = metrics.added_sizes(reads[len(metrics.COUNTED) * len(keys.partitions()):])
        return _parse(replies, groups, executions=executions, run=run_hist, queued=queued, pending=pending)

    def _call(self, partition: int, known: Collection[str], groups: Sequence[str]) -> Call:
        info_prefix = keys.worker("") if partition == 0 else ""  # the infos are partition 0's
        return ([keys.watch(partition), keys.workers(partition), keys.draining(partition),
                 *(jobs.queue_name(group, partition) for group in groups)],
                [self.dead_ms, keys.running("", partition), info_prefix, len(known), *known])


def _read_metrics(pipe: Any) -> None:
    metrics.read_counts(pipe)
    metrics.read_sizes(pipe)


def _parse(replies: list[list[Any]], groups: Sequence[str], **rest: Any) -> Pulse:
    """Every partition's part added up: the roster, its draining set and the infos are partition
    0's; a worker's busy count is its running sets' sizes in every partition; a queue's depth is
    its partitions' added up."""
    now, dead_before, pairs, draining, _, infos, _ = replies[0]
    roster = Roster.parse([dead_before, pairs, draining])
    busy: dict[str, int] = dict.fromkeys(roster.last_seen, 0)
    due, length = [0] * len(groups), [0] * len(groups)
    for reply in replies:
        part_pairs, part_busy, depths = reply[2], reply[4], reply[6]
        for i, count in zip(range(0, len(part_pairs), 2), part_busy, strict=True):
            worker_id = part_pairs[i].decode()
            if worker_id in busy:
                busy[worker_id] += int(count)
        for g in range(len(groups)):
            due[g] += int(depths[2 * g])
            length[g] += int(depths[2 * g + 1])
    return Pulse(
        now=int(now), roster=roster, busy=busy,
        infos={infos[i].decode(): infos[i + 1] for i in range(0, len(infos), 2)},
        queues={group: QueueDepth(due[g], length[g]) for g, group in enumerate(groups)},
        **rest,
    )
