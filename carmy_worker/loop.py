"""The running event loop, found without a system call.

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
import os
import threading


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
