"""A subscriber's mailbox: one execution's events waiting for the request that relays them,
bounded, so that a client that stops reading while its tool streams progress cannot make the
API buffer without end.

Only ``tool.progress`` events are ever dropped. Once more than ``MAX_PROGRESS`` of them, or
``MAX_PROGRESS_BYTES``, are waiting, the oldest waiting one goes: the newest progress is kept,
in order. ``tool.started``, ``tool.completed``, ``final``, ``RESYNC``, ``ENDED`` and ``STOPPING`` are
always kept (an execution has a handful). The relay reads ``take_dropped()`` to tell its client what it missed.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque

import msgspec

from carmy_worker.loop import Signal, running_loop
from carmy_worker.wire import Event, msgpack_encoder, progress_event

MAX_PROGRESS = 1000  # progress events one subscriber may have waiting
MAX_PROGRESS_BYTES = 1 << 20  # and their size; the newest is kept whatever its size
RESYNC = b""  # "re-read the record": put into every mailbox after the hub reconnects
# "Its record is there": put by the process's recheck (api.events.recheck) into the mailbox of
# an execution found ended without its final event. No event is one zero byte (msgpack of 0).
ENDED = b"\x00"
# "Answer now, without the outcome": put into every mailbox as this process's grace to stop ends
# (api.serving.stopping). No event is the byte 1 either (msgpack of 1).
STOPPING = b"\x01"

# The final event of a record too large to carry (wire.final_event): its reader GETs the record.
_FINAL_WITHOUT_RECORD = msgpack_encoder.encode(Event("final", b""))
_ASK_REDIS = (RESYNC, ENDED, _FINAL_WITHOUT_RECORD)

# How every tool.progress message starts (the event name, before its data).
_PROGRESS = progress_event(b"")[: -len(msgspec.msgpack.encode(b""))]


def is_progress(message: bytes) -> bool:
    return message.startswith(_PROGRESS)


class Mailbox:
    """``put_nowait`` (the hub) and ``get`` (one reader), like an ``asyncio.Queue`` of messages,
    but bounded by dropping the oldest waiting progress events."""

    def __init__(self, *, max_progress: int = MAX_PROGRESS, max_progress_bytes: int = MAX_PROGRESS_BYTES) -> None:
        self._items: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None  # the reader's, while it waits
        self._max_progress = max_progress
        self._max_progress_bytes = max_progress_bytes
        self._progress = 0  # waiting progress events
        self._progress_bytes = 0
        self._dropped = 0

    def put_nowait(self, message: bytes) -> None:
        if message in (RESYNC, ENDED) and self._items and self._items[-1] == message:
            return  # one re-read is enough, however often the hub reconnected or the recheck found it
        self._items.append(message)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if is_progress(message):
            self._progress += 1
            self._progress_bytes += len(message)
            while self._progress > 1 and (self._progress > self._max_progress
                                          or self._progress_bytes > self._max_progress_bytes):
                self._drop_oldest_progress()

    async def get(self, timeout: float | None = None, until: Signal | None = None) -> bytes | None:
        """The next message, waiting for one, or None after ``timeout`` seconds without one or
        once ``until`` is set; a cancelled wait takes none.

        One future and, with a timeout, one timer per wait: this is where every call waits for
        its answer, and ``asyncio.timeout`` around an ``asyncio.Event`` cost three times as much.
        """
        if not self._items:
            loop = running_loop()
            waiter = self._waiter = loop.create_future()
            timer = None if timeout is None else loop.call_later(timeout, _expire, waiter)
            wake = functools.partial(_expire, waiter)
            if until is not None:
                until.call_when_set(wake)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
                if until is not None:
                    until.forget(wake)
            if not self._items:
                return None
        message = self._items.popleft()
        if is_progress(message):
            self._progress -= 1
            self._progress_bytes -= len(message)
        return message

    def has_event_waiting(self) -> bool:
        """Whether the next ``get`` returns, at once, an event that carries all it says: not a
        ``RESYNC``, an ``ENDED`` or a ``final`` without its record, after which the reader asks Redis."""
        return bool(self._items) and self._items[0] not in _ASK_REDIS

    def take_dropped(self) -> int:
        """How many progress events were dropped since the last call."""
        dropped, self._dropped = self._dropped, 0
        return dropped

    def _drop_oldest_progress(self) -> None:
        for i, message in enumerate(self._items):  # progress events are nearly all of them
            if is_progress(message):
                del self._items[i]
                self._progress -= 1
                self._progress_bytes -= len(message)
                self._dropped += 1
                return


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
