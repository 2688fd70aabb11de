"""The pulse of the deployment: everything the console's live overview shows of Redis, read in
one round trip, once a second, by each API process (``api/console/live.py``), however many
people watch.

PULSE judges the workers by the roster's own rule (``roster.CUTOFF``, which marks Redis
watched, as WORKERS does: a reading is evidence that Redis is up) and counts what each one runs;
the metrics hashes and the admission sets are read in the same pipeline. A worker's info never
changes while it lives, so PULSE sends it only for the workers the caller does not know yet, and
the depth only of the queues it names.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from msgspec import Struct
from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from carmy_worker.store import jobs, keys, metrics
from carmy_worker.store.lua import ACCEPTED_WORK, NOW
from carmy_worker.store.roster import CUTOFF, Roster
from carmy_worker.store.scripts import Script, run

# The roster as WORKERS reads it, with each worker's running set counted, the infos of the
# workers not named in `known`, and each named queue's due jobs (due now and not leased: LEASE
# moves a leased job's score to its lease's end) and length.
# KEYS: watch, workers zset, draining set
# ARGV: dead ms, running-set prefix, info prefix, queue prefix, n, then n known worker ids, then groups
PULSE = Script("PULSE", ACCEPTED_WORK + NOW + CUTOFF + """
local dead_before = cutoff(now, tonumber(ARGV[1]))
local roster = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
local n = tonumber(ARGV[5])
local known = {}
for i = 6, 5 + n do known[ARGV[i]] = true end
local busy, infos = {}, {}
for i = 1, #roster, 2 do
  local w = roster[i]
  table.insert(busy, redis.call('SCARD', ARGV[2] .. w))
  if not known[w] then
    local info = redis.call('GET', ARGV[3] .. w)
    if info then
      table.insert(infos, w)
      table.insert(infos, info)
    end
  end
end
local queues = {}
for i = 6 + n, #ARGV do
  local queue = ARGV[4] .. ARGV[i]
  table.insert(queues, redis.call('ZCOUNT', queue, '-inf', now))
  table.insert(queues, redis.call('ZCARD', queue))
end
return {now, dead_before, roster, redis.call('SMEMBERS', KEYS[3]), busy, infos, queues}
""")

_PULSE_KEYS = [keys.WATCH, keys.WORKERS, keys.DRAINING]


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
        args = [self.dead_ms, keys.running("", 0), keys.worker(""), jobs.queue_name("", 0), len(known), *known, *groups]
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.execute_command(*PULSE.command(_PULSE_KEYS, args))
            metrics.read_counts(pipe)
            metrics.read_sizes(pipe)
            replies = await pipe.execute(raise_on_error=False)
        reply = replies[0]
        if isinstance(reply, NoScriptError):  # a restarted Redis: load it, and run it alone this once
            reply = await run(self.redis, PULSE, _PULSE_KEYS, args)
        for part in (reply, *replies[1:]):
            if isinstance(part, Exception):
                raise part
        executions, run_hist, _ = metrics.added_counts(replies[1:])
        queued, pending = metrics.added_sizes(replies[1 + len(metrics.COUNTED) * len(keys.partitions()):])
        return _parse(reply, groups, executions=executions, run=run_hist, queued=queued, pending=pending)


def _parse(reply: list[Any], groups: Sequence[str], **rest: Any) -> Pulse:
    now, dead_before, pairs, draining, busy, infos, depths = reply
    roster = Roster.parse([dead_before, pairs, draining])
    return Pulse(
        now=int(now), roster=roster,
        busy={pairs[i].decode(): int(count) for i, count in zip(range(0, len(pairs), 2), busy, strict=True)},
        infos={infos[i].decode(): infos[i + 1] for i in range(0, len(infos), 2)},
        queues={group: QueueDepth(int(depths[2 * i]), int(depths[2 * i + 1])) for i, group in enumerate(groups)},
        **rest,
    )
