"""Publishing a running tool's progress events in order, from any thread, in bounded memory."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque

import msgspec

from carmy_worker.loop import running_loop_or_none
from carmy_worker.store.progress import Progress
from carmy_worker.wire import event_decoder, progress_event

log = logging.getLogger("carmy.worker")

# How much may wait to be published, per execution. A tool reporting in a tight loop outruns
# Redis; beyond this the oldest waiting events give way (see ProgressPublisher).
BACKLOG_EVENTS = 256
BACKLOG_BYTES = 1024 * 1024


class _Message(msgspec.Struct):
    """The part of a ``ProgressData`` kept as the execution's status."""

    message: str | None = None


_message_decoder = msgspec.json.Decoder(_Message)


def _message_of(event: bytes) -> str | None:
    return _message_decoder.decode(event_decoder.decode(event).data).message


class ProgressPublisher:
    """Publishes the ``tool.progress`` events of one execution, in order, one at a time.

    ``emit`` may be called from the event loop or from a tool's thread; it never blocks and
    never waits for Redis. When more than ``BACKLOG_EVENTS`` events (or ``BACKLOG_BYTES``) wait,
    the oldest waiting plain progress event is dropped: a newer one supersedes it. If only
    partial results wait, the oldest of them is dropped. Drops are counted and logged once, when
    the execution ends. Nothing is started until the first event, so a tool that reports no
    progress costs nothing here. The message of the newest event published is kept as the
    execution's status (``store.progress``). Events are published as ``attempt``'s: once that
    attempt no longer holds the execution, Redis drops them (counted and logged the same way).
    """

    def __init__(self, progress: Progress, exec_id: str, attempt: int, loop: asyncio.AbstractEventLoop) -> None:
        self._exec_id = exec_id
        self._attempt = attempt
        self._progress = progress
        self._loop = loop
        self._lock = threading.Lock()  # guards everything below: emit runs in the tool's thread
        self._waiting: deque[tuple[bytes, bool]] = deque()  # (message, is a partial result)
        self._bytes = 0
        self._woken = False  # a wake-up is scheduled or the drain is running
        self._closed = False
        self._dropped = {"progress": 0, "partial": 0, "lost": 0}
        # Made with the drain's task, at the first event: most tools report none.
        self._ready: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def emit(self, data: bytes, partial: bool) -> None:
        """Queue one event (``data``: a ``ProgressData`` as JSON); ``partial``: it carries a
        partial result."""
        message = progress_event(data)
        with self._lock:
            if self._closed:
                return
            self._waiting.append((message, partial))
            self._bytes += len(message)
            while len(self._waiting) > 1 and (len(self._waiting) > BACKLOG_EVENTS or self._bytes > BACKLOG_BYTES):
                self._drop_oldest()
            if self._woken:
                return
            self._woken = True
        if self._on_loop():
            self._wake()
        else:
            self._loop.call_soon_threadsafe(self._wake)

    def _on_loop(self) -> bool:
        return running_loop_or_none() is self._loop  # None off the loop, without an exception

    def _drop_oldest(self) -> None:
        """Under the lock: the oldest plain progress event, else the oldest partial result (never
        the newest event)."""
        index = next((i for i, (_, partial) in enumerate(self._waiting) if not partial), 0)
        if index == len(self._waiting) - 1:
            index = 0
        message, partial = self._waiting[index]
        del self._waiting[index]
        self._bytes -= len(message)
        self._dropped["partial" if partial else "progress"] += 1

    def _wake(self) -> None:
        if self._task is None and not self._closed:
            self._start()
        if self._ready is not None:
            self._ready.set()

    def _start(self) -> None:
        self._ready = asyncio.Event()
        self._task = self._loop.create_task(self._drain(self._ready))

    def _next(self) -> bytes | None:
        with self._lock:
            if not self._waiting:
                self._woken = False
                return None
            message, _ = self._waiting.popleft()
            self._bytes -= len(message)
            return message

    async def _drain(self, ready: asyncio.Event) -> None:
        while True:
            await ready.wait()
            ready.clear()
            while (message := self._next()) is not None:
                try:
                    if not await self._progress(self._exec_id, self._attempt, message, _message_of(message)):
                        self._dropped["lost"] += 1  # not locked: only this task writes "lost"
                except Exception as exc:  # progress is best effort; the result is not
                    log.warning("progress event of execution %s lost: %s", self._exec_id, exc)
            if self._closed:
                return

    async def close(self) -> None:
        """Stop taking events and wait until those waiting are published."""
        with self._lock:
            self._closed = True
            waiting = bool(self._waiting)
        if self._task is None and waiting:  # emitted from a thread; its wake-up has not run yet
            self._start()
        if self._task is not None and self._ready is not None:
            self._ready.set()
            await self._task
        progress, partial, lost = self._dropped["progress"], self._dropped["partial"], self._dropped["lost"]
        if progress or partial:
            log.warning(
                "execution %s reported faster than its events could be published: %d progress events "
                "superseded and %d partial results dropped", self._exec_id, progress, partial)
        if lost:
            log.warning("execution %s: %d events dropped: attempt %d no longer holds it",
                        self._exec_id, lost, self._attempt)
