"""The API's side of an execution in Redis: submit (idempotency, admission and enqueue in one
script), cancel, read the record, and follow its events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Literal

from msgspec import Struct
from redis.asyncio import Redis
from redis.exceptions import RedisError

from api.catalog import CatalogTool
from api.hub import RESYNC
from api.settings import ApiSettings
from carmy_worker import keys, metrics, queue, records, scripts
from carmy_worker.context import AgentContext
from carmy_worker.errors import error
from carmy_worker.wire import Event, ExecutionJob, Record, event_decoder, msgpack_encoder, record_decoder

# How often a waiter re-reads the record when no event came: a safety net, not the path.
RECHECK_S = 5.0
# Beyond the queue wait and the tool's timeout, how long an admission slot may stay held
# before it is presumed leaked (a crashed API or worker) and pruned.
ADMISSION_GRACE_S = 30.0

SubmitKind = Literal["new", "join", "replay", "conflict", "full", "no_workers"]


class Submission(Struct):
    kind: SubmitKind
    execution_id: str = ""
    record: Record | None = None
    pending: int = 0


class Found(Struct):
    execution_id: str
    tool: str
    state: str  # queued, running or done
    record: Record | None


class Executions:
    def __init__(self, redis: Redis, settings: ApiSettings) -> None:
        self.redis = redis
        self.settings = settings
        self._submit = redis.register_script(scripts.SUBMIT)
        self._cancel = redis.register_script(scripts.CANCEL)

    async def submit(
        self, *, exec_id: str, tool: CatalogTool, arguments: bytes, request_id: str | None, agent: AgentContext,
    ) -> Submission:
        spec = tool.spec
        group = tool.groups[0] if tool.groups else ""
        queue_name = queue.queue_name(group)
        job = ExecutionJob(
            execution_id=exec_id, tool=spec.name, arguments=arguments, request_id=request_id,
            principal=agent.principal, session=agent.session, permissions=sorted(agent.permissions),
            metadata=agent.metadata,
        )
        job_bytes = queue.encode_job(msgpack_encoder.encode(job), int(time.time() * 1000))
        redis_keys = [keys.execution(exec_id), keys.PENDING, keys.QUEUED, queue.job_key(exec_id), queue_name]
        if request_id is not None:
            redis_keys.append(keys.idempotency(agent.principal, agent.session, request_id))
        queue_wait_ms = int(self.settings.queue_timeout * 1000)
        reply = await self._submit(keys=redis_keys, args=[
            exec_id, keys.fingerprint(spec.name, arguments), job_bytes, self.settings.retention,
            self.settings.max_pending, queue_wait_ms + int((tool.timeout + ADMISSION_GRACE_S) * 1000),
            queue_wait_ms, 1 if tool.groups else 0, spec.name, keys.owner(agent.principal),
            1 if spec.idempotent else 0, keys.RECORD_PREFIX, queue.wake_channel(queue_name),
        ])
        kind = reply[0].decode()
        if kind == "replay":
            return Submission("replay", reply[1].decode(), record_decoder.decode(reply[2]))
        if kind == "full":
            return Submission("full", pending=int(reply[1]))
        return Submission(kind, reply[1].decode() if len(reply) > 1 else "")

    async def lookup(self, exec_id: str, principal: str | None) -> Found | None:
        """The execution if it exists and belongs to ``principal``, else None."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.execution(exec_id), ["owner", "state", "tool"])
            pipe.get(keys.record(exec_id))
            (owner, state, tool), raw = await pipe.execute()
        if owner is None or owner.decode() != keys.owner(principal):
            return None  # unknown, expired, or someone else's: indistinguishable on purpose
        record = None if raw is None else record_decoder.decode(raw)
        return Found(exec_id, tool.decode(), "done" if record else state.decode(), record)

    async def cancel(self, exec_id: str, tool: str) -> None:
        """Cancel for a caller that went away: at once if queued, else via its worker."""
        record = records.cancelled(exec_id, tool, started=False)
        stored, final = records.final_event(record)
        await self._cancel(
            keys=[keys.execution(exec_id), keys.record(exec_id), keys.PENDING, keys.QUEUED],
            args=[exec_id, stored, self.settings.retention, keys.events(exec_id), final, keys.CANCEL_CHANNEL,
                  metrics.label(record)],
        )

    async def settled(self, exec_id: str, tool: str) -> Record | None:
        """The record if there is one; a synthesized uncertain one if Redis lost the execution."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(keys.record(exec_id))
            pipe.exists(keys.execution(exec_id))
            raw, alive = await pipe.execute()
        if raw is not None:
            return record_decoder.decode(raw)
        if not alive:  # e.g. Redis restarted without persistence: nobody will ever settle it
            return records.uncertain(exec_id, tool, "the store lost track of it")
        return None

    async def follow(self, exec_id: str, tool: str, messages: asyncio.Queue[bytes], *,
                     tick: float = RECHECK_S, patience: float = 60.0) -> AsyncIterator[Event | Record | None]:
        """The execution's events as they come, then its record (always last).

        Yields None after ``tick`` seconds without a message (for keep-alives); each such
        tick, and each reconnection of the hub, also re-reads the record. While Redis cannot be
        reached it keeps waiting, up to ``patience`` seconds, then ends with a (not stored)
        ``STORE_UNAVAILABLE`` result: the caller can retry with its request_id later.
        """
        unreachable_since: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            try:
                message: bytes | None = await asyncio.wait_for(messages.get(), tick)
            except TimeoutError:
                message = None
            if message is None or message == RESYNC:
                try:
                    record = await self.settled(exec_id, tool)
                    unreachable_since = None
                except RedisError:
                    record = None
                    unreachable_since = unreachable_since or loop.time()
                    if loop.time() - unreachable_since > patience:
                        record = records.failed(exec_id, tool, error(
                            "STORE_UNAVAILABLE", "The execution store cannot be reached; retry with the same "
                            "request_id to get the result once it is back.", retry_after=5))
                if record is not None:
                    yield record
                    return
                if message is None:
                    yield None
                continue
            event = event_decoder.decode(message)
            if event.name == "final":
                yield record_decoder.decode(event.data)
                return
            yield event
