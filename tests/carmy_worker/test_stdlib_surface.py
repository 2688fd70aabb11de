"""The standard library's private names ``carmy_worker`` relies on, pinned. Each is read with a
default or set blindly, so a Python that renamed one would not raise: the optimisation would
quietly stop (or, for ``_thread_id``, a loop's thread would go unchecked). This fails instead,
naming it. (``StreamReader._buffer``, read under redis-py's connections, is in
``store/test_redis_surface.py``.)"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading

SURFACE: dict[str, tuple[str, ...]] = {
    # loop.py (running_loop_or_none): the running loop or None, without a system call.
    "asyncio": ("_get_running_loop",),
    # loop.py (_runs_here): the thread an asyncio loop runs in (uvloop's do not say: None there).
    "asyncio.BaseEventLoop attributes": ("_thread_id",),
    # logs.py (configure): None turns off the caller lookup of every record (the logging HOWTO's
    # "Optimization" names it).
    "logging": ("_srcfile",),
}


def test_every_module_level_name_exists() -> None:
    assert [name for name in SURFACE["asyncio"] if not hasattr(asyncio, name)] == []
    assert [name for name in SURFACE["logging"] if not hasattr(logging, name)] == []


def test_the_running_loop_is_found_without_a_system_call_and_none_outside_one() -> None:
    assert asyncio._get_running_loop() is None

    async def found() -> asyncio.AbstractEventLoop | None:
        return asyncio._get_running_loop()

    event_loop = asyncio.SelectorEventLoop()  # asyncio's own, whatever policy the tests run under
    try:
        assert event_loop.run_until_complete(found()) is event_loop
    finally:
        event_loop.close()


def test_an_asyncio_loop_says_which_thread_runs_it() -> None:
    async def thread_of_running_loop() -> object:
        return getattr(asyncio.get_running_loop(), SURFACE["asyncio.BaseEventLoop attributes"][0], "missing")

    event_loop = asyncio.SelectorEventLoop()
    try:
        assert event_loop.run_until_complete(thread_of_running_loop()) == threading.get_ident()
    finally:
        event_loop.close()


def test_a_record_looks_up_its_caller_only_while_srcfile_is_set() -> None:
    assert "if _srcfile:" in inspect.getsource(logging.Logger._log)
