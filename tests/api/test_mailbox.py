"""A subscriber's mailbox: bounded by dropping the oldest waiting progress events, and only
those."""

from __future__ import annotations

import asyncio

from api.events.mailbox import ENDED, RESYNC, Mailbox, is_progress
from carmy_worker.loop import Signal
from carmy_worker.wire import MAX_EVENT_BYTES, Record, completed_event, final_event, progress_event, started_event


def progress(i: int, size: int = 0) -> bytes:
    return progress_event(b'{"progress":%d,"message":"%s"}' % (i, b"p" * size))


async def take_all(box: Mailbox, n: int) -> list[bytes]:
    return [await box.get() for _ in range(n)]


FINAL = final_event(Record(status_code=200, body=b"{}", tool="t", status="completed"))[1]


async def test_a_reader_that_keeps_up_gets_everything_in_order() -> None:
    box = Mailbox(max_progress=3)
    messages = [started_event("e", "t"), progress(1), progress(2), completed_event("e", "t", 1, True), FINAL]
    got = []
    for message in messages:
        box.put_nowait(message)
        got.append(await box.get())
    assert got == messages
    assert box.take_dropped() == 0


async def test_a_reader_that_falls_behind_loses_only_old_progress() -> None:
    box = Mailbox(max_progress=1000)
    started, completed = started_event("e", "t"), completed_event("e", "t", 1, True)
    box.put_nowait(started)
    for i in range(5000):
        box.put_nowait(progress(i))
    box.put_nowait(completed)
    box.put_nowait(FINAL)
    got = await take_all(box, 1003)
    assert got[0] == started and got[-2:] == [completed, FINAL]
    assert got[1:-2] == [progress(i) for i in range(4000, 5000)]  # the newest, in order
    assert box.take_dropped() == 4000
    assert box.take_dropped() == 0


async def test_progress_is_bounded_by_size_too_but_the_newest_is_kept() -> None:
    box = Mailbox(max_progress=1000, max_progress_bytes=10_000)
    for i in range(50):
        box.put_nowait(progress(i, size=3000))
    assert await take_all(box, 3) == [progress(i, 3000) for i in (47, 48, 49)]  # three fit in 10,000 bytes
    box.put_nowait(progress(98, size=3000))
    box.put_nowait(progress(99, size=50_000))  # over the limit alone: kept, and the only one
    assert await box.get() == progress(99, 50_000)
    assert box.take_dropped() == 48


async def test_resync_is_kept_and_not_repeated() -> None:
    box = Mailbox(max_progress=1)
    for message in (RESYNC, RESYNC, progress(1), progress(2), RESYNC, RESYNC):
        box.put_nowait(message)
    assert await take_all(box, 3) == [RESYNC, progress(2), RESYNC]
    assert not is_progress(RESYNC) and not is_progress(FINAL) and is_progress(progress(1))


async def test_an_ended_execution_is_told_once_and_never_dropped() -> None:
    box = Mailbox(max_progress=1)
    for message in (ENDED, ENDED, progress(1), progress(2), RESYNC, ENDED, ENDED):
        box.put_nowait(message)
    assert await take_all(box, 4) == [ENDED, progress(2), RESYNC, ENDED]
    assert not is_progress(ENDED)


async def test_a_cancelled_wait_takes_nothing() -> None:
    box = Mailbox()
    waiting = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    box.put_nowait(progress(1))
    waiting.cancel()  # woken, but cancelled before it ran
    await asyncio.gather(waiting, return_exceptions=True)
    assert await box.get() == progress(1)


async def test_a_wait_with_a_timeout_ends_empty_handed_or_with_the_message() -> None:
    box = Mailbox()
    assert await box.get(timeout=0.01) is None  # nothing came
    waiting = asyncio.ensure_future(box.get(timeout=30))
    await asyncio.sleep(0)
    box.put_nowait(FINAL)
    assert await waiting == FINAL



async def test_a_wait_until_a_signal_ends_empty_handed_once_it_is_set_and_forgets_it() -> None:
    box = Mailbox()
    gone = Signal()
    waiting = asyncio.ensure_future(box.get(timeout=30, until=gone))
    await asyncio.sleep(0)
    assert not waiting.done()
    gone.set()
    assert await asyncio.wait_for(waiting, 1) is None
    # Set already: the next wait ends at once, unless a message is there; no callback is left.
    assert await asyncio.wait_for(box.get(timeout=30, until=gone), 1) is None
    box.put_nowait(FINAL)
    assert await box.get(timeout=30, until=gone) == FINAL
    other = Signal()
    box.put_nowait(FINAL)
    assert await box.get(until=other) == FINAL
    waiting = asyncio.ensure_future(box.get(timeout=0.01, until=other))
    assert await waiting is None
    assert other._callbacks == []


async def test_an_event_is_waiting_only_if_the_next_get_needs_no_read_of_redis() -> None:
    box = Mailbox()
    assert not box.has_event_waiting()
    large = final_event(Record(status_code=200, body=b'"' + b"x" * (MAX_EVENT_BYTES + 1) + b'"', tool="t",
                               status="completed"))[1]
    for first in (RESYNC, ENDED, large):
        box.put_nowait(first)
        box.put_nowait(FINAL)
        assert not box.has_event_waiting()
        await take_all(box, 2)
    for message in (started_event("e", "t"), progress(1), FINAL):
        box.put_nowait(message)
        assert box.has_event_waiting()
        await box.get()
    assert not box.has_event_waiting()
