"""Where an execution's events go: to the channel of the API process that holds its caller
(one subscription per process, none per execution), only the final event unless someone
streams, and to every process that joined it later (a retry on another replica)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import redis
import redis.asyncio

from carmy_worker.store import keys
from carmy_worker.wire import event_decoder
from tests.sse import parse
from tests.support import Proc, Stack, wait_until, wait_until_async

SSE = {"accept": "text/event-stream"}


def subscriptions(sync_redis: redis.Redis) -> tuple[int, int]:
    """SUBSCRIBE and UNSUBSCRIBE commands (sharded or not) Redis has run so far."""
    stats = sync_redis.info("commandstats")

    def calls(*names: str) -> int:
        return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in names)
    return calls("subscribe", "ssubscribe"), calls("unsubscribe", "sunsubscribe")


@pytest.fixture
async def api_messages(stack: Stack) -> AsyncIterator[list[tuple[str, str]]]:
    """(execution id, event name) of every message on the channels of the API processes running
    now, as they come (sharded channels have no patterns: each is subscribed by name), in every
    partition: an API process has a channel in each, and hears of an execution on its partition's."""
    client = redis.asyncio.Redis.from_url(stack.redis_url)
    pubsub = client.pubsub()
    channels = [channel for p in keys.partitions()
                for channel in await client.execute_command("PUBSUB", "SHARDCHANNELS", keys.api_channel("*", p))]
    assert len(channels) % keys.partition_count() == 0 and channels
    for channel in channels:
        await pubsub.execute_command("SSUBSCRIBE", channel)
    connection = pubsub.connection
    assert connection is not None
    for _ in channels:
        assert (await connection.read_response(timeout=5))[0] == b"ssubscribe"
    seen: list[tuple[str, str]] = []

    async def read() -> None:
        while True:
            reply = await connection.read_response(timeout=None)
            if reply[0] == b"smessage":
                exec_id, _, event = reply[2].partition(b" ")
                seen.append((exec_id.decode(), event_decoder.decode(event).name))

    reader = asyncio.ensure_future(read())
    try:
        yield seen
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await pubsub.aclose()
        await client.aclose()


@pytest.fixture(scope="module")
def second_api(stack: Stack, worker: Proc) -> Iterator[str]:
    """Another API process on the same Redis: its base URL."""
    _, base = stack.api()
    wait_until(lambda: "gate" in httpx.get(base + "/agent/tools").text, what="the second API knows the tools")
    yield base


async def test_executions_run_without_any_subscribe(client: httpx.AsyncClient, sync_redis: redis.Redis) -> None:
    assert (await client.post("/agent/execute", json={"tool": "noop"})).status_code == 200  # the hub is up
    before = subscriptions(sync_redis)
    body = {"tool": "progress", "arguments": {"n": 2}}
    for _ in range(5):
        assert (await client.post("/agent/execute", json=body)).status_code == 200
        r = await client.post("/agent/execute", json=body, headers=SSE)
        assert parse(r.text)[-1][0] == "execution.completed"
    assert subscriptions(sync_redis) == before


async def test_nobody_listens_on_a_running_executions_own_channel(client: httpx.AsyncClient, stack: Stack,
                                                                sync_redis: redis.Redis) -> None:
    tag = uuid.uuid4().hex
    call = asyncio.ensure_future(client.post("/agent/execute", json={"tool": "gate", "arguments": {"tag": tag}}))
    start = stack.tmp / f"gate-start-{tag}"
    await wait_until_async(start.exists, what="the gate tool started")
    exec_id = start.read_text().strip()
    reply = sync_redis.hget(keys.execution(exec_id), "reply")
    assert reply is not None
    assert sync_redis.pubsub_numsub(keys.events(exec_id)) == [(keys.events(exec_id).encode(), 0)]
    assert sync_redis.execute_command("PUBSUB", "SHARDNUMSUB", reply) == [reply, 1]
    (stack.tmp / f"gate-open-{tag}").touch()
    assert (await call).status_code == 200


async def test_a_json_caller_gets_only_the_final_event(client: httpx.AsyncClient,
                                                       api_messages: list[tuple[str, str]]) -> None:
    r = await client.post("/agent/execute", json={"tool": "progress", "arguments": {"n": 3}})
    exec_id = r.json()["execution_id"]
    await wait_until_async(lambda: (exec_id, "final") in api_messages, what="the final event")
    assert [name for e, name in api_messages if e == exec_id] == ["final"]


async def test_a_streaming_caller_gets_every_event(client: httpx.AsyncClient,
                                                   api_messages: list[tuple[str, str]]) -> None:
    r = await client.post("/agent/execute", json={"tool": "progress", "arguments": {"n": 3}}, headers=SSE)
    exec_id = parse(r.text)[0][1]["execution_id"]
    await wait_until_async(lambda: (exec_id, "final") in api_messages, what="the final event")
    names = [name for e, name in api_messages if e == exec_id]
    assert names[0] == "tool.started" and names[-2:] == ["tool.completed", "final"]
    assert names.count("tool.progress") >= 3


async def test_progress_is_kept_for_polling_when_nobody_streams(client: httpx.AsyncClient, stack: Stack,
                                                                 sync_redis: redis.Redis) -> None:
    tag = uuid.uuid4().hex
    r = await client.post("/agent/execute", json={"tool": "gate", "arguments": {"tag": tag}},
                          headers={"prefer": "respond-async"})
    exec_id = r.json()["execution_id"]
    await wait_until_async(lambda: sync_redis.hget(keys.execution(exec_id), "message") == b"waiting at the gate",
                           what="the progress message stored")
    assert sync_redis.hget(keys.execution(exec_id), "stream") == b""
    (stack.tmp / f"gate-open-{tag}").touch()
    await wait_until_async(lambda: sync_redis.exists(keys.record(exec_id)), what="the record")


async def test_a_retry_on_another_api_process_joins_and_gets_the_events(
        client: httpx.AsyncClient, second_api: str, stack: Stack, sync_redis: redis.Redis) -> None:
    tag, request_id = uuid.uuid4().hex, f"req-{uuid.uuid4()}"
    body = {"tool": "gate", "arguments": {"tag": tag}, "request_id": request_id}
    first = asyncio.ensure_future(client.post("/agent/execute", json=body))  # JSON: only the final event
    start = stack.tmp / f"gate-start-{tag}"
    await wait_until_async(start.exists, what="the gate tool started")
    exec_id = start.read_text().strip()
    async with httpx.AsyncClient(base_url=second_api, timeout=30) as other:
        retry = asyncio.ensure_future(other.post("/agent/execute", json=body, headers=SSE))
        await wait_until_async(lambda: sync_redis.hget(keys.execution(exec_id), "joined"),
                               what="the second process joined")
        assert sync_redis.hget(keys.execution(exec_id), "stream") == b"1"  # the joiner streams
        (stack.tmp / f"gate-open-{tag}").touch()
        events = parse((await retry).text)
    # tool.completed travels only by pub/sub (a re-read of the record gives none): it reached the
    # second process's channel.
    assert [name for name, _ in events] == ["execution.started", "tool.completed", "execution.completed"]
    assert events[-1][1]["execution_id"] == exec_id and events[-1][1]["replayed"] is True
    assert (await first).json()["execution_id"] == exec_id


async def test_watching_from_another_api_process_gets_the_events(
        client: httpx.AsyncClient, second_api: str, stack: Stack, sync_redis: redis.Redis) -> None:
    tag = uuid.uuid4().hex
    r = await client.post("/agent/execute", json={"tool": "gate", "arguments": {"tag": tag}},
                          headers={"prefer": "respond-async"})
    exec_id = r.json()["execution_id"]
    async with httpx.AsyncClient(base_url=second_api, timeout=30) as other:
        watch = asyncio.ensure_future(other.get(f"/agent/executions/{exec_id}/events"))
        await wait_until_async(lambda: sync_redis.hget(keys.execution(exec_id), "joined"),
                               what="the watcher joined")
        (stack.tmp / f"gate-open-{tag}").touch()
        events = parse((await watch).text)
    assert [name for name, _ in events] == ["execution.started", "tool.completed", "execution.completed"]
