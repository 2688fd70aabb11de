"""``Executions.outcome``: the record comes from the ``final`` event, or from Redis when the event
announces a record too large to carry (``wire.MAX_EVENT_BYTES``); a caller gone is told so first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from api.calling.executions import Executions
from api.events.mailbox import Mailbox
from api.serving.departure import Departed, Departure
from carmy_worker.store import keys, records
from carmy_worker.store.attempts import Attempts
from carmy_worker.store.submit import Submit
from carmy_worker.wire import MAX_EVENT_BYTES, ExecutionJob, Record, event_decoder, json_encoder, progress_event
from tests.support import RedisServer, app_settings

RETENTION = 600
NEVER = 3600.0  # a tick that never comes: an answer can only be the final event's doing


@pytest.fixture
async def ar(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


async def settled_with(ar: redis.asyncio.Redis, data_json: bytes) -> tuple[str, Record, list[bytes]]:
    """A new execution run to its end with ``data_json`` as its result: its id, its record, and
    the messages its channel carried (up to the ``final`` event)."""
    exec_id = keys.new_execution_id()
    job = ExecutionJob(execution_id=exec_id, tool="t", arguments=b"{}")
    await Submit(ar, retention=RETENTION)(job, group="g", idempotent=False, workers_alive=True,
                                          max_pending=10, queue_wait_ms=60_000, admission_ms=60_000)
    attempts = Attempts(ar, worker_id="w1", retention=RETENTION)
    assert (await attempts.claim(exec_id, max_attempts=3)).verdict == "run"
    record = records.completed(exec_id, "t", data_json, cacheable=False, duration_ms=1)
    async with ar.pubsub() as pubsub:
        await pubsub.subscribe(keys.events(exec_id))
        assert await attempts.settle(record, exec_id=exec_id, attempt=1)
        messages: list[bytes] = []
        deadline = asyncio.get_running_loop().time() + 5
        while not messages or event_decoder.decode(messages[-1]).name != "final":
            assert asyncio.get_running_loop().time() < deadline, "no final event"
            message = await pubsub.get_message(timeout=1)
            if message is not None and message["type"] == "message":
                messages.append(message["data"])
    return exec_id, record, messages


async def outcome(ar: redis.asyncio.Redis, exec_id: str, messages: list[bytes]) -> Record:
    """What a waiter of ``exec_id`` answers, given ``messages`` from its subscription."""
    executions = Executions(ar, app_settings(retention=RETENTION), waiting={})
    queue = Mailbox()
    for message in messages:
        queue.put_nowait(message)
    return await asyncio.wait_for(executions.outcome(exec_id, "t", queue, tick=NEVER), 5)


async def test_a_record_too_large_for_its_event_is_read_from_redis(ar: redis.asyncio.Redis) -> None:
    exec_id, record, messages = await settled_with(ar, json_encoder.encode("x" * (MAX_EVENT_BYTES + 1)))
    assert event_decoder.decode(messages[-1]).data == b""  # announced, not carried
    assert await outcome(ar, exec_id, messages) == record


async def test_a_small_record_comes_with_its_event(ar: redis.asyncio.Redis) -> None:
    exec_id, record, messages = await settled_with(ar, b'{"n":1}')
    await ar.delete(keys.record(exec_id))
    assert await outcome(ar, exec_id, messages) == record  # not read from Redis: it is gone there


async def test_a_caller_gone_is_told_so_before_the_events_queued_for_it(ar: redis.asyncio.Redis) -> None:
    executions = Executions(ar, app_settings(retention=RETENTION), waiting={})
    queue = Mailbox()
    for n in range(3):
        queue.put_nowait(progress_event(b'{"n":%d}' % n))
    relayed: list[object] = []

    async def relay(event: object) -> None:
        relayed.append(event)

    gone = Departure()
    gone.set()
    with pytest.raises(Departed):
        await asyncio.wait_for(executions.outcome("exec_x", "t", queue, tick=NEVER, on_event=relay, until=gone), 5)
    assert relayed == []
