"""The catalog decodes each tool's entry once however many workers publish it, forgets the
entries of workers that are gone, and builds with the cyclic collector paused, then restored."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator

import msgspec
import pytest
import redis.asyncio

from api.calling.catalog import Catalog, ToolEntries, build_view, uncollected
from bench import many_tools
from carmy_worker.runtime.presence import describe, group_of
from carmy_worker.settings import WorkerSettings
from carmy_worker.store.roster import Liveness
from carmy_worker.wire import RetryPolicy, ScheduleSpec, WorkerInfo, WorkerTool, msgpack_encoder, worker_info_decoder
from tests.support import RedisServer

TOOLS = describe(list(many_tools.tools), WorkerSettings())


def published(worker_id: str, tools: list[WorkerTool], started_ms: int = 1) -> bytes:
    return msgpack_encoder.encode(WorkerInfo(
        worker_id=worker_id, started_ms=started_ms, tools=tools, group=group_of(tools), host="h", pid=7,
        schedules=[ScheduleSpec(name="nightly", cron="0 3 * * *", tool=tools[0].spec.name)], concurrency=4))


def changed(tool: WorkerTool) -> WorkerTool:
    return msgspec.structs.replace(tool, retry=RetryPolicy(max_attempts=9))


@pytest.fixture
async def ar(own_redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(own_redis_server.url)
    await client.flushall()
    yield client
    await client.flushall()
    await client.aclose()


def test_an_info_is_decoded_as_it_was_published() -> None:
    raw = published("w1", TOOLS)
    assert ToolEntries().info(raw) == worker_info_decoder.decode(raw)


def test_workers_publishing_a_tool_alike_share_its_entry_and_a_gone_one_is_forgotten() -> None:
    entries = ToolEntries()
    first = entries.info(published("w1", TOOLS))
    second = entries.info(published("w2", [changed(TOOLS[0]), *TOOLS[1:]], started_ms=2))
    assert all(a is b for a, b in zip(first.tools[1:], second.tools[1:], strict=True))
    assert first.tools[0] is not second.tools[0] and second.tools[0].retry.max_attempts == 9
    entries.keep_only([second])  # the first worker is gone: its own entry goes with it
    again = entries.info(published("w1", TOOLS, started_ms=3))
    assert again.tools[0] is not first.tools[0] and again.tools[0] == first.tools[0]
    assert again.tools[1] is second.tools[1]


async def test_a_refresh_builds_the_view_a_plain_decode_would(ar: redis.asyncio.Redis) -> None:
    liveness = Liveness(ar, dead_after=30.0)
    infos = {"w1": published("w1", TOOLS), "w2": published("w2", [changed(TOOLS[0]), *TOOLS[1:]], started_ms=2)}
    for worker_id, raw in infos.items():
        await liveness.register(worker_id, raw)
        await liveness.heartbeat(worker_id)
    catalog = Catalog(ar, "carmy", dead_after=30.0, refresh_interval=30.0)
    await catalog.refresh()
    expected = build_view("carmy", [(worker_info_decoder.decode(raw), True) for raw in infos.values()], {})
    assert catalog.view.catalog == expected.catalog and catalog.view.discovery == expected.discovery
    assert catalog.view.workers == expected.workers
    assert {name: (t.spec, t.retry, t.groups) for name, t in catalog.view.tools.items()} == \
        {name: (t.spec, t.retry, t.groups) for name, t in expected.tools.items()}
    assert gc.isenabled()


def test_the_collector_is_paused_for_a_burst_and_left_as_it_was() -> None:
    assert gc.isenabled()
    with pytest.raises(ValueError), uncollected():
        assert not gc.isenabled()
        raise ValueError
    assert gc.isenabled()
    gc.disable()
    try:
        with uncollected():
            assert not gc.isenabled()
        assert not gc.isenabled()  # it was off: it stays off
    finally:
        gc.enable()
