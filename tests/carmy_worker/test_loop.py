"""running_loop(): asyncio.get_running_loop() without its system call, never a stale loop."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
import uvloop

from carmy_worker.loop import Signal, first_done, running_loop, running_loop_or_none


def test_each_run_finds_its_own_loop() -> None:
    async def found() -> tuple[asyncio.AbstractEventLoop, asyncio.AbstractEventLoop]:
        return running_loop(), asyncio.get_running_loop()

    for run in (asyncio.run, uvloop.run, asyncio.run):  # a new loop each time, in the same thread
        mine, asyncios = run(found())
        assert mine is asyncios


def test_outside_a_running_loop() -> None:
    async def remember() -> None:
        running_loop()

    asyncio.run(remember())  # a loop remembered, and closed since
    with pytest.raises(RuntimeError):
        running_loop()
    assert running_loop_or_none() is None


def test_a_thread_without_a_loop_does_not_see_another_threads() -> None:
    seen: list[object] = []

    async def main() -> None:
        assert running_loop_or_none() is asyncio.get_running_loop()
        thread = threading.Thread(target=lambda: seen.append(running_loop_or_none()))
        thread.start()
        thread.join()

    asyncio.run(main())
    assert seen == [None]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_forgets_the_parents_loop() -> None:
    async def main() -> int:
        running_loop()
        pid = os.fork()
        if pid == 0:  # the child: the loop is the parent's, and not running here
            os._exit(0 if running_loop_or_none() is None else 1)
        return os.waitpid(pid, 0)[1]

    assert asyncio.run(main()) == 0


def test_a_loop_now_running_in_another_thread_is_not_this_threads() -> None:
    loop = asyncio.new_event_loop()

    async def remember() -> None:
        running_loop()

    loop.run_until_complete(remember())  # this thread found it
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        while not loop.is_running():
            threading.Event().wait(0.001)
        assert running_loop_or_none() is None  # it runs, but in the other thread
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


async def test_first_done_ends_with_the_first_of_a_future_a_signal_and_a_timeout() -> None:
    loop = asyncio.get_running_loop()
    never: asyncio.Future[None] = loop.create_future()
    done: asyncio.Future[None] = loop.create_future()
    loop.call_later(0.01, done.set_result, None)
    await asyncio.wait_for(first_done(never, done, timeout=30), 5)

    signal = Signal()
    loop.call_later(0.01, signal.set)
    await asyncio.wait_for(first_done(never, timeout=30, signal=signal), 5)
    await asyncio.wait_for(first_done(never, signal=signal), 5)  # already set: at once

    started = loop.time()
    await asyncio.wait_for(first_done(never, timeout=0.02, signal=Signal()), 5)
    assert loop.time() - started >= 0.02
    assert not never.done()


async def test_first_done_leaves_no_callback_on_the_signal_it_waited_for() -> None:
    loop = asyncio.get_running_loop()
    never: asyncio.Future[None] = loop.create_future()
    signal = Signal()
    await first_done(never, timeout=0.001, signal=signal)
    assert signal._callbacks == []  # no callback of a finished wait left to run when it is set
