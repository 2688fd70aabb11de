"""The live overview's sampler: once a second, one reading of Redis (``store.pulse``) made into a
frame (``framing.py``), encoded once and shared by every viewer of this API process; the last
five minutes of the charts' points are kept in memory for a page that opens.

However many people watch, Redis sees one reading a second per API process, and no viewer
holds a connection to it: a viewer waits for the next frame on a future all viewers share
(``next_frame``), and a slow one skips frames rather than queueing them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from redis.asyncio import Redis
from redis.exceptions import RedisError

from api.console.frame import LiveFrame, Point, encoder
from api.console.framing import Framer
from carmy_worker.loop import first_done, running_loop
from carmy_worker.store.pubsub import raise_if_cancelled, stop_if_cancelled
from carmy_worker.store.pulse import PulseReader

log = logging.getLogger("carmy.api")

INTERVAL_S = 1.0
HISTORY = 300  # frames: five minutes at one a second
WINDOW = 10  # steps the per-tool rates and quantiles cover: the last ten seconds


class Sampler:
    """Samples every ``interval`` seconds while ``run`` runs (the console starts it in the API's
    lifespan, and cancels it). ``frame`` and ``frame_json``: the latest frame (None and b""
    before the first)."""

    def __init__(self, redis: Redis, *, dead_after: float, interval: float = INTERVAL_S, history: int = HISTORY,
                 window: int = WINDOW) -> None:
        self.interval = interval
        self._reader = PulseReader(redis, dead_after=dead_after)
        self._framer = Framer(window=window)
        self._points: deque[Point] = deque(maxlen=history)
        self._history_json: tuple[int, bytes] = (-1, b"")
        self._next: asyncio.Future[None] | None = None
        self._failing = False
        self.seq = 0
        self.frame: LiveFrame | None = None
        self.frame_json = b""
        self.closed = False

    async def run(self) -> None:
        """Sample on the second until cancelled; a reading that fails makes a frame that says so."""
        try:
            while True:
                started = time.monotonic()
                await self.tick()
                await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))
        finally:
            self.close()

    async def tick(self) -> LiveFrame:
        """One reading, published: every viewer waiting gets it."""
        try:
            frame = await self.sample()
            stop_if_cancelled()
            if self._failing:
                log.info("console: Redis answers again")
            self._failing = False
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise_if_cancelled(exc)
            unreachable = isinstance(exc, RedisError | OSError | TimeoutError)
            if not self._failing:
                log.log(logging.WARNING if unreachable else logging.ERROR, "console: reading Redis failed: %r", exc,
                        exc_info=not unreachable)
            self._failing = True
            why = "Redis does not answer" if unreachable else "The overview cannot read Redis"
            frame = LiveFrame(seq=self.seq + 1, point=None, error=f"{why} ({type(exc).__name__}).")
        self._publish(frame)
        return frame

    async def sample(self) -> LiveFrame:
        """One reading made into a frame, not published (the next ``seq``)."""
        pulse = await self._reader.read(known=self._framer.known(), groups=self._framer.groups())
        return self._framer.frame(pulse, self.seq + 1)

    def _publish(self, frame: LiveFrame) -> None:
        self.seq, self.frame, self.frame_json = frame.seq, frame, encoder.encode(frame)
        if frame.point is not None:
            self._points.append(frame.point)
        self._wake()

    def history_json(self) -> bytes:
        """The charts' points of the last minutes, oldest first, as JSON: ``{"points": [...]}``.
        Encoded at most once a frame, whoever asks."""
        seq, body = self._history_json
        if seq != self.seq:
            body = encoder.encode({"points": list(self._points)})
            self._history_json = (self.seq, body)
        return body

    def next_frame(self) -> asyncio.Future[None]:
        """Done when the next frame is published, or the sampler stops: one future for every viewer."""
        if self._next is None or self._next.done():
            self._next = running_loop().create_future()
            if self.closed:
                self._next.set_result(None)
        return self._next

    async def first(self, timeout: float) -> LiveFrame | None:
        """The latest frame, waiting up to ``timeout`` s for the first one (a page served just
        after the API started)."""
        if self.frame is None and not self.closed:
            await first_done(self.next_frame(), timeout=timeout)
        return self.frame

    def close(self) -> None:
        """Stop: viewers waiting are woken and see ``closed``."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        waiting, self._next = self._next, None
        if waiting is not None and not waiting.done():
            waiting.set_result(None)
