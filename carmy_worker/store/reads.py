"""An execution read back by the API: its state and record, for a caller that polls, waits or
looks it up. Only the API reads these; every write of them is a script's."""

from __future__ import annotations

from collections.abc import Iterable

from msgspec import Struct
from redis.asyncio import Redis

from carmy_worker.store import keys, records
from carmy_worker.store.lua import READS_ONLY
from carmy_worker.store.scripts import Script, bind
from carmy_worker.wire import Record, record_decoder

# How many executions one STATES of ``Reads.ended`` asks about: about 0.2 ms of Redis's time,
# and as much of the API's to send and read it. (At 500, a millisecond or two: beside 10,000 idle
# streams, what the slowest of the other calls waited behind.)
ENDED_CHUNK = 100

# The `state` of each execution named (KEYS: one partition's, so one slot's), or nil for one
# whose hash Redis does not have. One command for a chunk of them, where a pipeline of an HGET
# each cost the API about 11 µs of Python per execution (10,000 waiting calls: 110 ms every
# recheck, in blocks of 11 ms that held every other call of the process: bench/README.md).
STATES = Script("STATES", READS_ONLY + """
local states = {}
for i, key in ipairs(KEYS) do states[i] = redis.call('HGET', key, 'state') end
return states
""")


class Found(Struct):
    execution_id: str
    tool: str
    state: str  # queued, running or done
    record: Record | None
    # When (Redis's clock, unix ms) it was accepted, and last changed (claimed, reported a
    # progress message, ended).
    created_ms: int | None = None
    updated_ms: int | None = None
    message: str | None = None  # the newest progress message, while it runs


class Reads:
    """An execution's state, as its callers see it, on one client."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._states = bind(redis, STATES)

    async def lookup(self, exec_id: str, principal: str | None) -> Found | None:
        """The execution if it exists and belongs to ``principal``, else None."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.execution(exec_id), ["owner", "state", "tool", "message", "queued_at", "started_at",
                                                 "message_at", "ended_at"])
            pipe.get(keys.record(exec_id))
            (owner, state, tool, message, *times), raw = await pipe.execute()
        if owner is None or owner.decode() != keys.owner(principal):
            return None  # unknown, expired, or someone else's: indistinguishable on purpose
        record = None if raw is None else record_decoder.decode(raw)
        return Found(exec_id, tool.decode(), "done" if record else state.decode(), record,
                     created_ms=int(times[0]) if times[0] else None,
                     updated_ms=max((int(t) for t in times if t), default=None),
                     message=None if message is None else message.decode(errors="replace"))

    async def progress(self, exec_id: str, tool: str) -> tuple[str, Record | None]:
        """Its state (queued, running or done) and its record once done.

        If Redis lost the execution (restarted without persistence, say), nobody will ever
        settle it: it is done, with a synthesized (not stored) uncertain record.
        """
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(keys.execution(exec_id), "state")
            pipe.get(keys.record(exec_id))
            state, raw = await pipe.execute()
        if raw is not None:
            return "done", record_decoder.decode(raw)
        if state is None:
            return "done", records.uncertain(exec_id, tool, "the store lost track of it")
        return state.decode(), None

    async def ended(self, some: list[str]) -> list[str]:
        """Those of ``some`` (one partition's, at most ``ENDED_CHUNK``: ``chunks``) that have ended
        (their record is written: SETTLE and the scripts that impose one set ``state`` to done in
        the same script) or that Redis lost: the ones whose record is worth reading. One ``HGET``
        each, in one STATES: one partition's, so that on a cluster it goes to that slot's node."""
        states = await self._states(keys=[keys.execution(exec_id) for exec_id in some], args=[])
        return [exec_id for exec_id, state in zip(some, states, strict=True) if state is None or state == b"done"]


def chunks(exec_ids: Iterable[str], chunk: int = ENDED_CHUNK) -> list[list[str]]:
    """``exec_ids`` in lists of at most ``chunk``, each of one partition's: what ``Reads.ended``
    asks about at once."""
    by_partition: dict[int, list[str]] = {}
    for exec_id in exec_ids:
        by_partition.setdefault(keys.partition_of(exec_id), []).append(exec_id)
    return [ids[start:start + chunk] for ids in by_partition.values() for start in range(0, len(ids), chunk)]
