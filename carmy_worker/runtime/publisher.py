"""Publishing a running tool's progress events in order, from any thread."""

from __future__ import annotations

import asyncio
import logging
import threading

from redis.asyncio import Redis

from carmy_worker.wire import progress_event

log = logging.getLogger("carmy.worker")
_DONE = b""


class ProgressPublisher:
    """Orders ``tool.progress`` events of one execution and publishes them one by one.

    ``emit`` may be called from the event loop or from a tool's thread. Nothing is started
    until the first event, so a tool that reports no progress costs nothing here.
    """

    def __init__(self, redis: Redis, channel: str, loop: asyncio.AbstractEventLoop) -> None:
        self._redis = redis
        self._channel = channel
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._queue: asyncio.Queue[bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def emit(self, data: bytes) -> None:
        if threading.get_ident() == self._loop_thread:
            self._put(data)
        else:
            self._loop.call_soon_threadsafe(self._put, data)

    def _put(self, data: bytes) -> None:
        if self._closed:
            return
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._task = self._loop.create_task(self._drain(self._queue))
        self._queue.put_nowait(progress_event(data))

    async def _drain(self, queue: asyncio.Queue[bytes]) -> None:
        while (message := await queue.get()) is not _DONE:
            try:
                await self._redis.publish(self._channel, message)
            except Exception as exc:  # progress is best effort; the result is not
                log.warning("progress event lost: %s", exc)

    async def close(self) -> None:
        """Stop taking events and wait until those taken are published."""
        self._closed = True
        if self._queue is not None and self._task is not None:
            self._queue.put_nowait(_DONE)
            await self._task
