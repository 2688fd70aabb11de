"""Where the scripts publish an execution's events (``lua.EMIT``), and JOIN: to the API process
named at SUBMIT, to those that joined since, every event only if someone streams; an execution
submitted without a reply channel (by an API of before) on its own channel, as then."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio
from redis.client import PubSub

from carmy_worker.store import keys, records
from carmy_worker.store.attempts import Attempts
from carmy_worker.store.follow import Join
from carmy_worker.store.submit import Submit
from carmy_worker.store.verdicts import Verdicts
from carmy_worker.wire import ExecutionJob, completed_event, event_decoder, json_encoder

RETENTION = 600
# The executions' partition (the last: not 0 when there are several), and each API's channel there,
# where an API hears of the executions of that partition (api/events/hub.py's channel_for).
PARTITION = keys.partition_count() - 1
API_A, API_B = keys.api_channel("a", PARTITION), keys.api_channel("b", PARTITION)


@pytest.fixture
def channels(sync_redis: redis.Redis) -> Iterator[PubSub]:
    """Subscribed (confirmed) to both API channels; ``heard`` reads it."""
    p = sync_redis.pubsub()
    p.ssubscribe(API_A, API_B)  # sharded, as the scripts SPUBLISH to them
    for _ in range(2):
        message = p.get_sharded_message(timeout=2)
        assert message is not None and message["type"] == "ssubscribe"
    yield p
    p.close()


def heard(p: PubSub, wait: float = 0.2) -> list[tuple[str, str, str]]:
    """(channel, execution id, event name) of every message within ``wait`` seconds."""
    out = []
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        message = p.get_message(timeout=left)
        if message is not None and message["type"] in ("message", "smessage"):
            data: bytes = message["data"]
            exec_id, _, event = data.partition(b" ")
            channel = message["channel"].decode()
            out.append((channel, exec_id.decode(), event_decoder.decode(event).name))
    return out


async def submitted(ar: redis.asyncio.Redis, *, reply: str, stream: bool) -> str:
    exec_id = keys.new_execution_id(PARTITION)
    job = ExecutionJob(execution_id=exec_id, tool="t", arguments=b"{}")
    sub = await Submit(ar, retention=RETENTION)(job, group="g", idempotent=True,
                                                workers_alive=True, max_pending=10, queue_wait_ms=60_000,
                                                admission_ms=60_000, reply=reply, stream=stream)
    assert sub.kind == "new"
    return exec_id


async def run(ar: redis.asyncio.Redis, exec_id: str) -> None:
    """Claim and settle it, as a worker does."""
    attempts = Attempts(ar, worker_id="w1", retention=RETENTION)
    assert (await attempts.claim(exec_id, max_attempts=3)).verdict == "run"
    record = records.completed(exec_id, "t", json_encoder.encode(1), cacheable=False, duration_ms=1)
    done = completed_event(exec_id, "t", 1, ok=True)
    assert await attempts.settle(record, exec_id=exec_id, attempt=1, completed_event=done)


async def test_a_caller_that_does_not_stream_hears_only_the_final_event(
        ar: redis.asyncio.Redis, channels: PubSub) -> None:
    exec_id = await submitted(ar, reply=API_A, stream=False)
    await run(ar, exec_id)
    assert heard(channels) == [(API_A, exec_id, "final")]


async def test_a_streaming_caller_hears_every_event_on_its_process_channel(
        ar: redis.asyncio.Redis, channels: PubSub) -> None:
    exec_id = await submitted(ar, reply=API_A, stream=True)
    await run(ar, exec_id)
    assert heard(channels) == [(API_A, exec_id, "tool.started"), (API_A, exec_id, "tool.completed"),
                               (API_A, exec_id, "final")]


async def test_a_joiner_hears_from_then_on_and_its_streaming_turns_streaming_on(
        ar: redis.asyncio.Redis, channels: PubSub, sync_redis: redis.Redis) -> None:
    exec_id = await submitted(ar, reply=API_A, stream=False)
    join = Join(ar)
    assert (await join(exec_id, "t", channel=API_B, stream=True)).state == "queued"
    assert (await join(exec_id, "t", channel=API_B, stream=True)).state == "queued"  # once is enough
    assert (await join(exec_id, "t", channel=API_A, stream=False)).state == "queued"  # the submitter's own
    assert sync_redis.hget(keys.execution(exec_id), "joined") == API_B.encode()
    await run(ar, exec_id)
    assert sorted(heard(channels)) == sorted((channel, exec_id, name) for channel in (API_A, API_B)
                                             for name in ("tool.started", "tool.completed", "final"))
    joined = await join(exec_id, "t", channel=API_B, stream=False)
    assert joined.state == "done" and joined.record is not None and joined.record.status == "completed"


async def test_a_join_of_an_execution_the_store_lost_answers_uncertain(ar: redis.asyncio.Redis) -> None:
    joined = await Join(ar)(keys.new_execution_id(), "t", channel=API_A, stream=False)
    assert joined.state == "done" and joined.record is not None and joined.record.error_code == "EXECUTION_UNCERTAIN"


async def test_an_imposed_record_goes_to_the_reply_channel(ar: redis.asyncio.Redis, channels: PubSub) -> None:
    exec_id = await submitted(ar, reply=API_A, stream=False)
    assert await Verdicts(ar, retention=RETENTION).cancel(exec_id, "t") == "cancelled"
    assert heard(channels) == [(API_A, exec_id, "final")]


async def test_an_execution_without_a_reply_channel_uses_its_own_and_its_joiners(
        ar: redis.asyncio.Redis, channels: PubSub, sync_redis: redis.Redis) -> None:
    exec_id = await submitted(ar, reply="", stream=False)  # as an API of before submitted it
    own = sync_redis.pubsub()
    own.subscribe(keys.events(exec_id))
    assert (own.get_message(timeout=2) or {}).get("type") == "subscribe"
    await Join(ar)(exec_id, "t", channel=API_B, stream=False)
    await run(ar, exec_id)
    assert [event_decoder.decode(m["data"]).name for m in iter(lambda: own.get_message(timeout=0.2), None)
            if m["type"] == "message"] == ["tool.started", "tool.completed", "final"]
    assert heard(channels) == [(API_B, exec_id, "final")]
    own.close()
