"""One shared pub/sub connection per API process, fanned out to the requests that wait.

The process subscribes once, at start, to channels of its own (``keys.api_channel``), one per
partition of the store, sharded (``SSUBSCRIBE``): a script publishes in its own slot, so on a
cluster a message stays on its shard, and the hub keeps a connection to each shard owning one of
its channels (``store.shardpubsub``); the broadcast channels (catalog changes) are plain ones,
which a cluster delivers on every node: subscribed on one of those connections.

A request registers the execution it waits for (``expect``) before it submits it, naming its
partition's channel (``channel_for``) as where the execution's events go (SUBMIT's ``reply``, or
JOIN's for a call that follows an execution already running): every message there carries its
execution's id, and the hub hands it to the mailboxes expecting that id. No per-execution
SUBSCRIBE, no round trip to wait for.

If a channel's subscription drops (its connection, or on a cluster its shard's), every request
waiting on an execution of its partition is told (``RESYNC``) so it re-reads the stored record,
and again once the channel is confirmed anew: a lost message costs a read, never an answer.
Meanwhile new calls of that partition are refused (``HubUnavailable``); the other partitions'
go on, so that a dead primary of a cluster refuses only the calls it would have served.
Each request's messages wait in a bounded ``Mailbox``: one that does not keep up loses old
progress events, never the others, and never makes the process buffer without end.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Collection, Mapping

from redis.asyncio import Redis

from api.events.mailbox import RESYNC as RESYNC
from api.events.mailbox import STOPPING, Mailbox
from carmy_worker.store import keys
from carmy_worker.store.pubsub import Message
from carmy_worker.store.shardpubsub import listen

# How long the app's start waits for the process's channel to be subscribed.
READY_WAIT = 2.0


class HubUnavailable(Exception):
    """The process's channel is not subscribed (Redis is gone, or not confirmed yet)."""


class EventHub:
    def __init__(self, redis: Redis, *, on_broadcast: dict[str, Callable[[bytes], None]] | None = None) -> None:
        self._redis = redis
        # This process's channels, one per partition, and those Redis has not confirmed the
        # subscription to on their current connection: until then an event published there
        # could be lost unnoticed, so no call of that partition is taken.
        process = uuid.uuid4().hex
        self.channels = tuple(keys.api_channel(process, p) for p in keys.partitions())
        self._names = {channel.encode(): channel for channel in self.channels}
        self._partition = {channel: p for p, channel in enumerate(self.channels)}
        self._unconfirmed = set(self.channels)
        self._confirmed = asyncio.Event()  # every channel confirmed
        self._lost: set[str] = set()  # dropped, not confirmed since: their waiters re-read once they are
        self._expected: dict[str, set[Mailbox]] = {}
        # Process-wide channels (catalog changes) and their handlers: always subscribed.
        self._broadcast = dict(on_broadcast or {})
        self._reader: asyncio.Task[None] | None = None

    async def start(self, *, wait: float = READY_WAIT) -> None:
        """Start listening; return once the process's channel is subscribed, or after ``wait``
        seconds (Redis may not be there yet: calls are refused until it is)."""
        self._reader = asyncio.create_task(self._read_forever())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._confirmed.wait()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader  # listen_forever closes its connection as it ends

    def expect(self, exec_id: str) -> Expectation:
        """The events of ``exec_id`` that reach this process's ``channel``, from now on: a
        context manager whose ``with`` gives their ``Mailbox``.

        Register before the execution can publish (before SUBMIT or JOIN names ``channel``).
        Entering raises ``HubUnavailable`` while the process's subscription is not confirmed.
        """
        return Expectation(self, exec_id)

    @property
    def waiting(self) -> Mapping[str, Collection[Mailbox]]:
        """The executions expected now, each with its mailboxes (live: the process's recheck,
        ``api.events.recheck``, reads it as it goes)."""
        return self._expected

    def channel_for(self, exec_id: str) -> str:
        """Where ``exec_id``'s events reach this process: the channel of its partition."""
        return self.channels[keys.partition_of(exec_id)]

    def _register(self, exec_id: str) -> Mailbox:
        if self._unconfirmed and self.channel_for(exec_id) in self._unconfirmed:
            raise HubUnavailable("not connected")
        queue = Mailbox()
        self._expected.setdefault(exec_id, set()).add(queue)
        return queue

    def _unregister(self, exec_id: str, queue: Mailbox) -> None:
        waiting = self._expected.get(exec_id)
        if waiting is not None:
            waiting.discard(queue)
            if not waiting:
                del self._expected[exec_id]

    async def _read_forever(self) -> None:
        # On a cluster, a connection per shard, the broadcasts on one of them (store.shardpubsub).
        await listen(self._redis, lambda: self.channels, self._dispatch, name="event hub",
                     broadcast=lambda: list(self._broadcast), on_drop=self._dropped)

    def _dropped(self, channels: Collection[str]) -> None:
        own = {self._partition[c] for c in channels if c in self._partition}
        if not own:
            return  # a broadcast channel alone
        lost = {self.channels[p] for p in own}
        self._confirmed.clear()
        self._unconfirmed |= lost
        self._lost |= lost
        self._resync(own)  # whatever was in flight there may be lost

    def stop_waiting(self) -> None:
        """Tells every request waiting on an execution to answer now, without its outcome: this
        process's grace to stop is ending (``api.serving.stopping``)."""
        for queues in self._expected.values():
            for queue in queues:
                queue.put_nowait(STOPPING)

    def _resync(self, partitions: Collection[int]) -> None:
        """Tells every request waiting on an execution of ``partitions`` to re-read its record."""
        every = len(partitions) == len(self.channels)
        for exec_id, queues in self._expected.items():
            if every or keys.partition_of(exec_id) in partitions:
                for queue in queues:
                    queue.put_nowait(RESYNC)

    def _dispatch(self, message: Message) -> None:
        kind, raw = message["type"], message["channel"]
        own = self._names.get(raw)
        if kind == "message" and own is not None:
            exec_id, _, event = message["data"].partition(b" ")
            for queue in self._expected.get(exec_id.decode(), ()):
                queue.put_nowait(event)
        elif kind == "message":
            handler = self._broadcast.get(raw.decode())
            if handler is not None:
                handler(message["data"])
        elif kind == "subscribe" and own is not None:
            self._unconfirmed.discard(own)
            if own in self._lost:  # events published before this confirmation were lost
                self._lost.discard(own)
                self._resync((self._partition[own],))
            if not self._unconfirmed:
                self._confirmed.set()


class Expectation:
    """``EventHub.expect``'s context manager: a class rather than a generator, since every call
    enters one (``contextlib.contextmanager`` cost three times as much)."""

    __slots__ = ("_exec_id", "_hub", "_queue")

    def __init__(self, hub: EventHub, exec_id: str) -> None:
        self._hub = hub
        self._exec_id = exec_id
        self._queue: Mailbox | None = None

    def __enter__(self) -> Mailbox:
        self._queue = self._hub._register(self._exec_id)
        return self._queue

    def __exit__(self, *exc: object) -> None:
        if self._queue is not None:
            self._hub._unregister(self._exec_id, self._queue)
            self._queue = None
