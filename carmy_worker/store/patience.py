"""Time as the event loop could use it: wall time minus the time its timers ran late.

A loop busy with thousands of requests runs every timer late; a deadline measured on the wall
clock then expires for work that never had its turn, and a process that is merely busy answers
as if Redis were gone. ``LoopClock`` ticks every ``TICK`` seconds while someone reads it, and
each tick advances it by at most ``TICK``, however late the tick came.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

TICK = 0.05


class LoopClock:
    """A monotonic clock (seconds) that does not count the loop's lateness.

    It ticks only while held (``hold``/``let_go``), so an idle process runs no timer. Between
    ticks, it reads the wall time since the last one, up to ``TICK``.
    """

    def __init__(self, *, tick: float = TICK, on_tick: Callable[[], None] | None = None) -> None:
        self._tick = tick
        self._elapsed = 0.0  # what the ticks so far counted
        self._last = 0.0  # loop.time() of the last tick
        self._holders = 0
        self._handle: asyncio.TimerHandle | None = None
        self._on_tick = on_tick  # called after every tick, while held

    def now(self) -> float:
        if self._handle is None:
            return self._elapsed
        return self._elapsed + min(asyncio.get_running_loop().time() - self._last, self._tick)

    def hold(self) -> None:
        """Keep it ticking (until the matching ``let_go``)."""
        self._holders += 1
        if self._handle is None:
            loop = asyncio.get_running_loop()
            self._last = loop.time()
            self._handle = loop.call_later(self._tick, self._advance)

    def let_go(self) -> None:
        self._holders -= 1
        if self._holders <= 0 and self._handle is not None:
            self._elapsed = self.now()
            self._handle.cancel()
            self._handle = None
            self._holders = 0

    def _advance(self) -> None:
        loop = asyncio.get_running_loop()
        self._elapsed += min(loop.time() - self._last, self._tick)
        self._last = loop.time()
        self._handle = loop.call_later(self._tick, self._advance)
        if self._on_tick is not None:
            self._on_tick()
