"""The running event loop, found without a system call; and waiting for the first of several
things without a task per thing.

On Python 3.11, ``asyncio.get_running_loop()`` calls ``getpid()`` every time, to notice a fork
(3.12 no longer does). On the virtual machines the benchmark runs on that system call is most
of the lookup, and the lookups were 8 % of the API's CPU under load (``bench/README.md``).
``running_loop()`` remembers, per thread, the loop it found, for as long as that loop runs;
a forked child forgets it. One limit: a uvloop loop does not say which thread runs it, so a
uvloop loop stopped in one thread and run again in another would still be found by the first
thread while it runs no loop of its own (asyncio's loops do say, and are checked).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any


class _Seen(threading.local):
    loop: asyncio.AbstractEventLoop | None = None


_seen = _Seen()


def running_loop() -> asyncio.AbstractEventLoop:
    """``asyncio.get_running_loop()``: the loop running in this thread, else ``RuntimeError``."""
    loop = _seen.loop
    if loop is None or not _runs_here(loop):
        loop = _seen.loop = asyncio.get_running_loop()
    return loop


def running_loop_or_none() -> asyncio.AbstractEventLoop | None:
    """The loop running in this thread, or None (a thread of its own, no loop yet)."""
    loop = _seen.loop
    if loop is None or not _runs_here(loop):
        loop = _seen.loop = asyncio._get_running_loop()
    return loop


def _runs_here(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop``, found running in this thread before, still runs here (one loop runs in
    a thread at a time)."""
    if not loop.is_running():
        return False
    thread = getattr(loop, "_thread_id", None)  # asyncio's loops say where they run
    return thread is None or thread == threading.get_ident()


def _forget() -> None:
    _seen.loop = None


os.register_at_fork(after_in_child=_forget)


class Signal(asyncio.Event):
    """An ``asyncio.Event`` that also calls back when set, so that ``first_done`` waits for it
    with no task of its own (a run's cancellation, say)."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], object]] = []

    def set(self) -> None:
        super().set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def call_when_set(self, callback: Callable[[], object]) -> None:
        """``callback()`` once set (at once if it is)."""
        if self.is_set():
            callback()
        else:
            self._callbacks.append(callback)

    def forget(self, callback: Callable[[], object]) -> None:
        with contextlib.suppress(ValueError):
            self._callbacks.remove(callback)


async def first_done(*futures: asyncio.Future[Any], timeout: float | None = None,
                     signal: Signal | None = None, woken: asyncio.Future[None] | None = None) -> None:
    """Until one of ``futures`` is done, ``signal`` is set or ``timeout`` seconds have passed: one
    future that the first of them completes. This is how every call waits for its tool or its
    client, and ``asyncio.wait``, or a task waiting for an event, cost more than a quick call.

    ``woken``: that future, given by the caller so that it may complete it too, from where the
    end is known first (the last step of the task waited for: one turn of the loop sooner than
    that task's done callback, which only runs in the next turn)."""
    loop = running_loop()
    if woken is None:
        woken = loop.create_future()

    def wake(_: object = None) -> None:
        if not woken.done():
            woken.set_result(None)

    for future in futures:
        future.add_done_callback(wake)
    timer = None if timeout is None else loop.call_later(timeout, wake)
    if signal is not None:
        signal.call_when_set(wake)
    try:
        await woken
    finally:
        if timer is not None:
            timer.cancel()
        for future in futures:
            future.remove_done_callback(wake)
        if signal is not None:
            signal.forget(wake)
