"""An execution read back by the API: its state and record, for a caller that polls, waits or
looks it up. Only the API reads these; every write of them is a script's."""

from __future__ import annotations

from collections.abc import Iterable

from msgspec import Struct
from redis.asyncio import Redis

from carmy_worker.store import keys, records
from carmy_worker.wire import Record, record_decoder

# How many executions one pipeline of ``Reads.ended`` asks about: a round trip of a few tens of
# KiB, short enough not to hold a connection long.
ENDED_CHUNK = 1000


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

    async def ended(self, exec_ids: Iterable[str], *, chunk: int = ENDED_CHUNK) -> list[str]:
        """Those of ``exec_ids`` that have ended (their record is written: SETTLE and the scripts
        that impose one set ``state`` to done in the same script) or that Redis lost: the ones
        whose record is worth reading.

        One ``HGET`` each, pipelined: a pipeline per ``chunk`` of one partition's executions, so
        that on a cluster each is one slot's and goes to its node whole.
        """
        by_partition: dict[int, list[str]] = {}
        for exec_id in exec_ids:
            by_partition.setdefault(keys.partition_of(exec_id), []).append(exec_id)
        ended: list[str] = []
        for ids in by_partition.values():
            for start in range(0, len(ids), chunk):
                some = ids[start:start + chunk]
                async with self.redis.pipeline(transaction=False) as pipe:
                    for exec_id in some:
                        pipe.hget(keys.execution(exec_id), "state")
                    states = await pipe.execute()
                ended.extend(exec_id for exec_id, state in zip(some, states, strict=True)
                             if state is None or state == b"done")
        return ended
