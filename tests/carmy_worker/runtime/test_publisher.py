"""ProgressPublisher: events go out in order, and a tool reporting faster than Redis takes them
costs a bounded backlog (older events give way), never memory without end."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator

import msgspec
import pytest
import redis.asyncio
from redis.asyncio.client import PubSub

from carmy_worker.runtime.publisher import BACKLOG_BYTES, BACKLOG_EVENTS, ProgressPublisher
from carmy_worker.store import keys
from carmy_worker.store.progress import Progress
from carmy_worker.wire import ProgressData, event_decoder, json_encoder
from tests.support import RedisServer


@pytest.fixture
async def ar(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


RUNNING = {"attempt": "1", "state": "running", "worker": "w"}  # attempt 1 runs on worker w


@pytest.fixture
async def channel(ar: redis.asyncio.Redis) -> AsyncIterator[tuple[str, PubSub]]:
    """A fresh execution, its attempt 1 running on worker w, and a confirmed subscription to its
    events."""
    exec_id = keys.new_execution_id()
    await ar.hset(keys.execution(exec_id), mapping=RUNNING)
    async with ar.pubsub() as pubsub:
        await pubsub.subscribe(keys.events(exec_id))
        assert (await pubsub.get_message(timeout=5) or {}).get("type") == "subscribe"
        yield exec_id, pubsub
    await ar.delete(keys.execution(exec_id))


def publisher_of(ar: redis.asyncio.Redis, exec_id: str) -> ProgressPublisher:
    """The publisher of attempt 1 at ``exec_id`` on worker w."""
    return ProgressPublisher(Progress(ar, worker_id="w"), exec_id, 1, asyncio.get_running_loop())


def event(i: int, *, partial: object = msgspec.UNSET, pad: str | None = None) -> bytes:
    return json_encoder.encode(ProgressData(execution_id="e", tool="t", progress=i, message=pad, partial=partial))


async def published_until(pubsub: PubSub, last: int) -> list[ProgressData]:
    """Every event published, up to the one whose progress is ``last`` (the newest emitted)."""
    got: list[ProgressData] = []
    while not got or got[-1].progress != last:
        message = await asyncio.wait_for(pubsub.get_message(timeout=5), 10)
        assert message is not None, f"no event with progress {last}; got {[e.progress for e in got][-5:]}"
        got.append(msgspec.json.decode(event_decoder.decode(message["data"]).data, type=ProgressData))
    return got


async def test_events_are_published_in_order(ar: redis.asyncio.Redis, channel: tuple[str, PubSub]) -> None:
    exec_id, pubsub = channel
    publisher = publisher_of(ar, exec_id)
    for i in range(1, 11):
        publisher.emit(event(i), False)
        await asyncio.sleep(0)
    await publisher.close()
    assert [e.progress for e in await published_until(pubsub, 10)] == list(range(1, 11))


async def test_a_tight_loop_keeps_the_newest_events(
    ar: redis.asyncio.Redis, channel: tuple[str, PubSub], caplog: pytest.LogCaptureFixture,
) -> None:
    exec_id, pubsub = channel
    publisher = publisher_of(ar, exec_id)
    for i in range(1, 20_001):  # never yields: nothing can be published meanwhile
        publisher.emit(event(i), False)
    with caplog.at_level(logging.WARNING, logger="carmy.worker"):
        await publisher.close()
    got = [e.progress for e in await published_until(pubsub, 20_000)]
    assert got == list(range(20_001 - BACKLOG_EVENTS, 20_001))
    assert f"{20_000 - BACKLOG_EVENTS} progress events superseded and 0 partial results dropped" in caplog.text
    assert exec_id in caplog.text


async def test_partial_results_outlast_plain_progress(ar: redis.asyncio.Redis, channel: tuple[str, PubSub]) -> None:
    exec_id, pubsub = channel
    publisher = publisher_of(ar, exec_id)
    for i in range(1, 2001):
        if i % 100 == 0:
            publisher.emit(event(i, partial={"rows": i}), True)
        else:
            publisher.emit(event(i), False)
    await publisher.close()
    got = await published_until(pubsub, 2000)
    assert [e.partial for e in got if e.partial is not msgspec.UNSET] == [{"rows": i} for i in range(100, 2001, 100)]
    assert len(got) == BACKLOG_EVENTS
    assert [e.progress for e in got] == sorted(e.progress for e in got)


async def test_only_partial_results_waiting_the_oldest_go(ar: redis.asyncio.Redis, channel: tuple[str, PubSub]) -> None:
    exec_id, pubsub = channel
    publisher = publisher_of(ar, exec_id)
    for i in range(1, 1001):
        publisher.emit(event(i, partial=i), True)
    await publisher.close()
    assert [e.partial for e in await published_until(pubsub, 1000)] == list(range(1001 - BACKLOG_EVENTS, 1001))


async def test_the_backlog_is_bounded_in_bytes_too(ar: redis.asyncio.Redis, channel: tuple[str, PubSub]) -> None:
    exec_id, pubsub = channel
    publisher = publisher_of(ar, exec_id)
    pad = "p" * 60_000
    for i in range(1, 101):
        publisher.emit(event(i, pad=pad), False)
    await publisher.close()
    got = await published_until(pubsub, 100)
    assert len(got) <= BACKLOG_BYTES // 60_000
    assert [e.progress for e in got] == list(range(101 - len(got), 101))


async def test_events_from_a_thread_keep_their_order_and_the_newest(
    ar: redis.asyncio.Redis, channel: tuple[str, PubSub],
) -> None:
    exec_id, pubsub = channel
    publisher = publisher_of(ar, exec_id)

    def tool() -> None:
        for i in range(1, 50_001):
            publisher.emit(event(i), False)

    thread = threading.Thread(target=tool)
    thread.start()
    await asyncio.to_thread(thread.join)
    await publisher.close()
    got = [e.progress for e in await published_until(pubsub, 50_000)]
    assert got == sorted(set(got))  # in order, none twice, up to the newest


async def test_events_after_close_are_dropped(ar: redis.asyncio.Redis, channel: tuple[str, PubSub]) -> None:
    exec_id, pubsub = channel
    publisher = publisher_of(ar, exec_id)
    publisher.emit(event(1), False)
    await publisher.close()
    publisher.emit(event(2), False)  # a thread the tool left behind, say
    await ar.publish(keys.events(exec_id), b"end")
    messages = []
    while (message := await pubsub.get_message(timeout=5)) is not None and message["data"] != b"end":
        messages.append(message["data"])
    assert [msgspec.json.decode(event_decoder.decode(m).data)["progress"] for m in messages] == [1]


async def test_the_newest_message_is_kept_while_it_runs(ar: redis.asyncio.Redis, channel: tuple[str, PubSub]) -> None:
    exec_id, pubsub = channel
    exe = keys.execution(exec_id)
    publisher = publisher_of(ar, exec_id)
    publisher.emit(event(1, pad="first"), False)
    publisher.emit(event(2), False)  # no message: the status stays the last one given
    await publisher.close()
    assert [e.progress for e in await published_until(pubsub, 2)] == [1, 2]
    assert await ar.hget(exe, "message") == b"first"
    assert int(await ar.hget(exe, "message_at") or 0) > 0


async def test_no_status_for_an_execution_that_is_not_running(ar: redis.asyncio.Redis) -> None:
    exec_id = keys.new_execution_id()  # expired, say: its hash must not come back without a TTL
    publisher = publisher_of(ar, exec_id)
    publisher.emit(event(1, pad="late"), False)
    await publisher.close()
    assert not await ar.exists(keys.execution(exec_id))


@pytest.mark.parametrize("now", [
    {"attempt": "2"},  # another attempt took it (the worker was paused, say)
    {"worker": "other"},  # the same number, claimed again by another worker after Redis lost it
    {"reaped": "1"},  # reaped: put back in the queue, no attempt holds it yet
    {"state": "done"},  # recorded
], ids=["another-attempt", "another-worker", "reaped", "recorded"])
async def test_an_attempt_that_no_longer_holds_its_execution_publishes_nothing(
    ar: redis.asyncio.Redis, channel: tuple[str, PubSub], now: dict[str, str], caplog: pytest.LogCaptureFixture,
) -> None:
    """A thread the tool left behind, or events that waited while the worker was paused: none
    reaches the followers of the execution, nor replaces its status; the worker says so once."""
    exec_id, pubsub = channel
    exe = keys.execution(exec_id)
    await ar.hset(exe, mapping={**now, "message": "the current attempt's"})
    publisher = publisher_of(ar, exec_id)
    for i in range(1, 4):
        publisher.emit(event(i, pad="late"), False)
    with caplog.at_level(logging.WARNING, logger="carmy.worker"):
        await publisher.close()
    await ar.publish(keys.events(exec_id), b"end")
    assert (await pubsub.get_message(timeout=5) or {}).get("data") == b"end"
    assert await ar.hget(exe, "message") == b"the current attempt's"
    assert f"execution {exec_id}: 3 events dropped: attempt 1 no longer holds it" in caplog.text
