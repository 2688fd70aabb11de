"""One shared pub/sub connection per API process, fanned out to the requests that wait.

A request subscribes to its execution's channel (and waits for Redis to confirm) before it
enqueues, so no event can be missed. If the connection drops, every subscriber is told
(``RESYNC``) so it re-reads the stored record: a lost message costs a read, never an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Callable

from redis.asyncio import Redis
from redis.asyncio.client import PubSub

log = logging.getLogger("carmy.api")

RESYNC = b""  # put into every queue after a reconnection
SUBSCRIBE_TIMEOUT = 2.0


class HubUnavailable(Exception):
    """Redis did not confirm a subscription in time."""


class EventHub:
    def __init__(self, redis: Redis, *, on_broadcast: dict[str, Callable[[bytes], None]] | None = None) -> None:
        self._redis = redis
        self._pubsub: PubSub | None = None
        self._queues: dict[str, set[asyncio.Queue[bytes]]] = {}
        self._confirms: dict[str, list[asyncio.Future[None]]] = defaultdict(list)
        # Process-wide channels (catalog changes) and their handlers: always subscribed.
        self._broadcast = dict(on_broadcast or {})
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._reader = asyncio.create_task(self._read_forever())

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._pubsub is not None:
            await self._pubsub.aclose()

    @contextlib.asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[asyncio.Queue[bytes]]:
        """A queue of the messages on ``channel``, from the moment Redis confirmed."""
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        first = channel not in self._queues
        self._queues.setdefault(channel, set()).add(queue)
        try:
            if first or self._confirms.get(channel):
                await self._confirm(channel, send=first)
            yield queue
        finally:
            subscribers = self._queues.get(channel)
            if subscribers is not None:
                subscribers.discard(queue)
                if not subscribers:
                    del self._queues[channel]
                    if self._pubsub is not None:
                        with contextlib.suppress(Exception):
                            await self._pubsub.unsubscribe(channel)

    async def _confirm(self, channel: str, *, send: bool) -> None:
        confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._confirms[channel].append(confirmed)
        try:
            if send:
                if self._pubsub is None:
                    raise HubUnavailable("not connected")
                await self._pubsub.subscribe(channel)
            await asyncio.wait_for(confirmed, SUBSCRIBE_TIMEOUT)
        except (TimeoutError, OSError, ConnectionError) as exc:
            raise HubUnavailable(str(exc) or "no confirmation") from exc
        except Exception as exc:  # redis-py's own connection errors
            raise HubUnavailable(str(exc)) from exc
        finally:
            with contextlib.suppress(ValueError):
                self._confirms[channel].remove(confirmed)
            if not self._confirms[channel]:
                self._confirms.pop(channel, None)

    async def _read_forever(self) -> None:
        delay, reconnecting = 0.1, False
        while True:
            pubsub = self._redis.pubsub()
            try:
                await pubsub.subscribe(*self._broadcast, *self._queues)
                self._pubsub = pubsub
                if reconnecting:  # back: let every waiter re-read its record now, not at its next tick
                    log.info("pub/sub connection restored")
                    self._resync()
                delay, reconnecting = 0.1, False
                await self._read(pubsub)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not reconnecting:
                    log.warning("pub/sub connection lost (%s); reconnecting", exc)
                reconnecting = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            finally:
                self._pubsub = None
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                self._resync()  # whatever was in flight may be lost

    def _resync(self) -> None:
        for queues in self._queues.values():
            for queue in queues:
                queue.put_nowait(RESYNC)

    async def _read(self, pubsub: PubSub) -> None:
        while True:
            message = await pubsub.get_message(timeout=None)
            if message is None:
                continue
            kind, channel = message["type"], message["channel"].decode()
            if kind == "message":
                handler = self._broadcast.get(channel)
                if handler is not None:
                    handler(message["data"])
                for queue in self._queues.get(channel, ()):
                    queue.put_nowait(message["data"])
            elif kind == "subscribe":
                for future in self._confirms.get(channel, ()):
                    if not future.done():
                        future.set_result(None)
