"""The API's side of an execution in Redis: submit it, find it, cancel it, and wait for its
record while relaying its events."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping

from redis.asyncio import Redis
from redis.exceptions import RedisError

from api.calling.catalog import CatalogTool
from api.events.hub import RESYNC
from api.events.mailbox import ENDED, STOPPING, Mailbox
from api.events.recheck import RECHECK_S, Recheck
from api.serving.departure import Departed
from api.settings import ApiSettings
from carmy_worker.loop import Signal, running_loop
from carmy_worker.sdk.context import AgentContext
from carmy_worker.sdk.errors import server_stopping, store_unavailable
from carmy_worker.store import records
from carmy_worker.store.audit import AuditTrail
from carmy_worker.store.durable import Durability
from carmy_worker.store.follow import Join, Joined
from carmy_worker.store.memory import StoreMemory
from carmy_worker.store.reads import Found, Reads
from carmy_worker.store.submit import Pending, Submit
from carmy_worker.store.verdicts import Verdicts
from carmy_worker.wire import Event, ExecutionJob, Record, event_decoder, record_decoder

log = logging.getLogger("carmy.api")

# Beyond the queue wait and the tool's timeout, how long an admission slot may stay held
# before it is presumed leaked (a crashed API or worker) and pruned.
ADMISSION_GRACE_S = 30.0
# How long a waiter keeps waiting while Redis cannot be reached before it answers
# STORE_UNAVAILABLE (not stored: a retry with the same request_id gets the real result).
PATIENCE_S = 60.0
# Cancels of executions whose callers left, run at once by one process (the rest wait their
# turn): a thousand callers resetting together must not take every Redis connection.
ABANDONING = 8


class Executions:
    def __init__(self, redis: Redis, settings: ApiSettings, durability: Durability | None = None,
                 memory: StoreMemory | None = None, *, waiting: Mapping[str, Collection[Mailbox]]) -> None:
        """``waiting``: the executions this process's requests wait for (``EventHub.waiting``),
        which its recheck asks about."""
        self.redis = redis
        self.settings = settings
        # New calls are refused while Redis is out of memory for them (store/memory.py).
        self._submit = Submit(redis, retention=settings.retention, durability=durability, memory=memory)
        self._audit = AuditTrail(redis)
        self._verdicts = Verdicts(redis, retention=settings.retention, durability=durability)
        self._join = Join(redis)
        self._reads = Reads(redis)
        # The process's one recheck of the executions it waits for; its run() is the app's task.
        self.recheck = Recheck(self._reads, waiting)
        self._abandoning = asyncio.Semaphore(ABANDONING)

    def submit(
        self, *, exec_id: str, tool: CatalogTool, arguments: bytes, request_id: str | None, agent: AgentContext,
        reply: str = "", stream: bool = True, traceparent: str | None = None, via: str = "http",
        track: bool = False,
    ) -> Pending:
        """Queue a call of ``tool`` (``arguments`` as canonical JSON) for the newest live group
        serving it: awaited, the ``Submission`` (``Submit.send``; ``track``: ``Pending.written``
        says when the SUBMIT has left).

        Its events go to ``reply`` (this process's channel), all of them if ``stream``, else only
        the final one (see ``Submit``). ``traceparent``: the span the worker's spans join, when
        tracing is on. ``via``: the door it came in by, for its audit entry."""
        job = ExecutionJob(
            execution_id=exec_id, tool=tool.spec.name, arguments=arguments, request_id=request_id,
            principal=agent.principal, session=agent.session, permissions=sorted(agent.permissions),
            metadata=agent.metadata, traceparent=traceparent,
        )
        queue_wait_ms = int(self.settings.queue_timeout * 1000)
        return self._submit.send(
            job, group=tool.groups[0] if tool.groups else "", idempotent=tool.spec.idempotent,
            workers_alive=bool(tool.groups), max_pending=self.settings.max_pending, queue_wait_ms=queue_wait_ms,
            admission_ms=queue_wait_ms + int((tool.timeout + ADMISSION_GRACE_S) * 1000), reply=reply, stream=stream,
            quota=self.settings.quotas.of(agent.principal), via=via, effect=tool.spec.effect, track=track,
        )

    async def replayed(self, exec_id: str, record: Record, *, via: str) -> None:
        """Audit a finished execution answered again to a retry that came by ``via``. Not worth
        failing the answer for: a Redis error is logged and the replay goes out."""
        try:
            await self._audit.replayed(exec_id, record, via=via)
        except (RedisError, OSError) as exc:
            log.warning("replay of %s not audited: %s", exec_id, exc)

    async def join(self, exec_id: str, tool: str, *, channel: str, stream: bool) -> Joined:
        """Follow an execution already submitted: its events from now on go to ``channel`` too
        (all of them if ``stream``), unless it is done (then with its record)."""
        return await self._join(exec_id, tool, channel=channel, stream=stream)

    async def lookup(self, exec_id: str, principal: str | None) -> Found | None:
        """The execution if it exists and belongs to ``principal``, else None."""
        return await self._reads.lookup(exec_id, principal)

    async def progress(self, exec_id: str, tool: str) -> tuple[str, Record | None]:
        """Its state (queued, running or done) and its record once done (a synthesized uncertain
        one if Redis lost it: ``store.reads``)."""
        return await self._reads.progress(exec_id, tool)

    async def settled(self, exec_id: str, tool: str) -> Record | None:
        """The record if there is one (see ``progress``)."""
        return (await self.progress(exec_id, tool))[1]

    async def cancel(self, exec_id: str, tool: str) -> None:
        """Cancel: at once if queued, else via its worker, which records the cancellation."""
        await self._verdicts.cancel(exec_id, tool)

    async def abandon(self, exec_id: str, tool: str) -> None:
        """Cancel for a caller that went away. Nobody is left to retry it, so it tries again while
        Redis is busy or unreachable, up to ``PATIENCE_S``, then logs the failure. A burst of
        disconnects takes at most ``ABANDONING`` of the pool's connections: the calls still
        waiting keep theirs."""
        loop = asyncio.get_running_loop()
        give_up, delay = loop.time() + PATIENCE_S, 0.05
        while True:
            try:
                async with self._abandoning:
                    await self._verdicts.cancel(exec_id, tool)  # cancelling twice changes nothing
                return
            except RedisError as exc:
                if loop.time() >= give_up:
                    log.warning("could not cancel %s: %s", exec_id, exc)
                    return
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)

    async def outcome(
        self, exec_id: str, tool: str, messages: Mailbox, *, tick: float = RECHECK_S,
        on_event: Callable[[Event], Awaitable[None]] | None = None,
        on_idle: Callable[[], Awaitable[None]] | None = None, until: Signal | None = None,
    ) -> Record:
        """Wait for the execution's record, passing each event before it to ``on_event``;
        ``Departed`` once ``until`` is set (the caller's ``Departure``: it has gone).

        ``messages`` is its mailbox (``EventHub.expect``: in ``waiting``, where the recheck finds
        it). The ``final`` event carries the record, unless the record is large: then it is read
        from Redis. It is read too after each reconnection of the hub (``RESYNC``) and when the
        process's recheck finds the execution ended (``ENDED``: its final event was lost): a lost
        message costs a read, never an answer. After ``tick`` seconds without a message it calls ``on_idle`` (for
        keep-alives: a stream passes its keep-alive period), with no Redis command: the recheck
        for lost events is the process's (``api.events.recheck``), not a waiter's. While Redis
        cannot be reached it keeps waiting, up to ``PATIENCE_S``, then answers a (not stored)
        ``STORE_UNAVAILABLE`` result: once it knows the store is down (a read failed: its own,
        after the hub's reconnection, or the recheck's) it wakes when its patience ends, however
        long ``tick`` is.
        """
        began = running_loop().time()
        while True:
            message = await messages.get(timeout=self._pause(tick, began), until=until)  # None: none came
            if message is None:
                if until is not None and until.is_set():
                    raise Departed
                if self._out_of_patience(began):
                    return _unavailable(exec_id, tool)
                if on_idle is not None:
                    await on_idle()
                continue
            if message == STOPPING:
                return records.refused(exec_id, tool, server_stopping(exec_id))  # not stored: it goes on
            if message not in (RESYNC, ENDED):
                event = event_decoder.decode(message)
                if event.name != "final":
                    # Events queued for a caller already gone are not relayed to nobody first:
                    # it leaves (and cancels) now, however many came meanwhile.
                    if until is not None and until.is_set():
                        raise Departed
                    if on_event is not None:
                        await on_event(event)
                    continue
                if event.data:
                    return record_decoder.decode(event.data)
                # A large record is announced without itself (wire.MAX_EVENT_BYTES): read it.
            try:
                record = await self.settled(exec_id, tool)
                self.recheck.reached()
            except RedisError:
                self.recheck.unreachable()  # the recheck wakes it once the record is there
                if self._out_of_patience(began):
                    return _unavailable(exec_id, tool)
                continue
            if record is not None:
                if message == ENDED:
                    # Settled, and its final event never came, with no reconnection to explain
                    # it: a message lost on its way, or a worker that publishes only to the
                    # execution's own channel (one older than the per-process channels).
                    log.warning("execution %s: settled without its final event reaching this process",
                                exec_id)
                return record

    def _out_of_patience(self, began: float) -> bool:
        """Whether Redis has been out of reach for over ``PATIENCE_S`` of this wait."""
        down = self.recheck.down_since
        return down is not None and running_loop().time() - max(down, began) > PATIENCE_S

    def _pause(self, tick: float, began: float) -> float:
        """How long a wait may go without a message: ``tick``, or less while Redis is out of
        reach, so that the wait ends when its patience does."""
        down = self.recheck.down_since
        if down is None:
            return tick
        return min(tick, max(0.0, max(down, began) + PATIENCE_S - running_loop().time()))


def _unavailable(exec_id: str, tool: str) -> Record:
    # Not stored: the execution goes on, and a retry with the same request_id joins it.
    return records.refused(exec_id, tool, store_unavailable(
        "The execution store cannot be reached; retry with the same request_id to get the result once it is back.",
        retry_after=5))
