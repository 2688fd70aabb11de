"""Deadlines on one timer (carmy_worker/deadlines.py): a deadline cancels its task once passed
(up to a tick late), is told from any other cancellation, and leaves a task that met it alone."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import TypeVar

import pytest
import uvloop

from carmy_worker.deadlines import Deadlines

T = TypeVar("T")


async def bounded(deadlines: Deadlines, seconds: float, awaited: asyncio.Future[T]) -> T:
    task = deadlines.start(seconds)
    try:
        return await awaited
    except asyncio.CancelledError:
        if deadlines.expired(task):
            raise TimeoutError from None
        raise
    finally:
        deadlines.stop(task)


async def test_a_passed_deadline_cancels_its_task_at_most_a_tick_late() -> None:
    deadlines = Deadlines(tick=0.05)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await bounded(deadlines, 0.1, asyncio.get_running_loop().create_future())
    assert 0.1 <= time.monotonic() - started < 0.1 + 0.05 + 0.5  # the last term: a busy machine


async def test_a_met_deadline_leaves_the_task_alone_and_the_timer_stops_with_nothing_listed() -> None:
    deadlines = Deadlines(tick=0.02)
    done = asyncio.get_running_loop().create_future()
    done.set_result("answer")
    assert await bounded(deadlines, 0.05, done) == "answer"
    await asyncio.sleep(0.1)  # past the deadline: nothing is cancelled any more
    assert deadlines._timer is None and deadlines._due == {}


async def test_another_cancellation_is_not_taken_for_the_deadline() -> None:
    deadlines = Deadlines(tick=0.02)
    task = asyncio.create_task(bounded(deadlines, 10, asyncio.get_running_loop().create_future()))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancellation_that_comes_with_the_deadline_still_cancels() -> None:
    deadlines = Deadlines(tick=0.02)
    task = asyncio.create_task(bounded(deadlines, 0.03, asyncio.get_running_loop().create_future()))
    await asyncio.sleep(0.035)  # its deadline has passed, and the next look fires it
    task.cancel()  # a shutdown, say: it must not be swallowed as a timeout
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_many_tasks_each_get_their_own_deadline() -> None:
    deadlines = Deadlines(tick=0.02)
    loop = asyncio.get_running_loop()
    slow = asyncio.create_task(bounded(deadlines, 0.05, loop.create_future()))
    answered = loop.create_future()
    quick = asyncio.create_task(bounded(deadlines, 5, answered))
    with pytest.raises(TimeoutError):
        await slow
    assert not quick.done()
    answered.set_result("in time")
    assert await quick == "in time"


@pytest.mark.slow
def test_a_reply_that_came_while_the_process_stood_still_is_read_not_taken_for_none() -> None:
    """The process stands still past a read's deadline (a worker stopped, a frozen VM: here the
    loop held up by a blocking sleep) while its reply arrives. On waking the loop runs its timers
    before it reads its sockets (uvloop, as the workers run), so the deadline's look comes first:
    one that late waits a tick, and the reply is read. It used to be taken for no reply at all."""

    async def main() -> str:
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=ours)
        deadlines = Deadlines(tick=0.05)
        reply: asyncio.Future[bytes] = asyncio.ensure_future(reader.readexactly(6))

        reading = asyncio.ensure_future(bounded(deadlines, 0.2, reply))
        await asyncio.sleep(0.01)  # the read waits, its deadline listed
        threading.Timer(0.3, theirs.sendall, (b"answer",)).start()  # while the loop stands still
        time.sleep(1.5)  # the process stands still, past the deadline and LATE_S
        try:
            return (await reading).decode()
        finally:
            writer.close()
            theirs.close()

    assert uvloop.run(main()) == "answer"
