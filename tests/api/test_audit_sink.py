"""The audit sink's loop (``api.events.sink``) in process, against the real Redis: two sinks on one
file write each entry once; entries a dead process left pending are written by a live one; a
line that could not be written is written later, once; a group Redis lost is created again; a
Redis out of reach never ends the loop. Entries are appended by hand, as the scripts write them.
(The sink of real API processes, fed by real executions: tests/e2e/test_audit.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from api.events.sink import AppendFile, AuditSink, audit_sink
from carmy_worker.store import keys
from carmy_worker.store.audit import stream_id
from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.shipment import CLAIM_IDLE_MS, GROUP, Shipment
from tests.support import NO_REDIS, RedisServer, wait_until_async


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    c = redis.asyncio.Redis.from_url(redis_server.url)
    await c.flushall()
    yield c
    await c.aclose()


@contextlib.asynccontextmanager
async def running(sink: AuditSink) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(sink.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await sink.close()


def new_sink(url: str, path: Path) -> AuditSink:
    return audit_sink(RedisConnector(url), f"file:{path}", connect_timeout=0.5)


async def append(client: redis.asyncio.Redis, execution_id: str) -> None:
    await client.xadd(keys.audit(0), {"execution_id": execution_id, "tool": "echo", "status": "completed",
                                   "finished_at": 1_700_000_000_000, "via": "http", "principal": "alice"})


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def joined(client: redis.asyncio.Redis) -> None:
    """Once the group exists (a sink created it at the stream's end: entries before it are not shipped)."""
    async def there() -> bool:
        return bool(await client.exists(keys.audit(0))) and bool(await client.xinfo_groups(keys.audit(0)))

    for _ in range(500):
        if await there():
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("no sink joined the group")


async def test_two_sinks_write_each_entry_once(client: redis.asyncio.Redis, redis_server: RedisServer,
                                               tmp_path: Path) -> None:
    out = tmp_path / "audit.jsonl"
    async with running(new_sink(redis_server.url, out)), running(new_sink(redis_server.url, out)):
        await joined(client)
        for i in range(200):
            await append(client, f"exec-{i}")
        await wait_until_async(lambda: len(lines(out)) >= 200, 10, "200 lines")
        await asyncio.sleep(0.3)  # time for a second copy of any of them to show up
        for partition in keys.partitions():
            assert await client.xpending(keys.audit(partition), GROUP) == {"pending": 0, "min": None, "max": None,
                                                                           "consumers": []}
    written = lines(out)
    assert sorted(line["execution_id"] for line in written) == sorted(f"exec-{i}" for i in range(200))
    assert written[0]["principal"] == "alice" and written[0]["tool"] == "echo" and "id" in written[0]


async def test_a_dead_processs_pending_entries_are_written_by_a_live_one(
        client: redis.asyncio.Redis, redis_server: RedisServer, tmp_path: Path) -> None:
    dead = Shipment(client, "dead-process")
    await dead.join()
    await append(client, "left-pending")
    [entry] = (await dead.read(10, block_ms=100)).entries  # read, never written nor acknowledged
    await client.xclaim(keys.audit(0), GROUP, "dead-process", 0, [stream_id(entry.id)[1]], idle=CLAIM_IDLE_MS + 1)
    out = tmp_path / "audit.jsonl"
    async with running(new_sink(redis_server.url, out)):
        await wait_until_async(lambda: lines(out), 10, "the line")
    assert [line["execution_id"] for line in lines(out)] == ["left-pending"]


class FailsOnce(AppendFile):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.failed = False

    def write(self, data: bytes) -> None:
        if not self.failed:
            self.failed = True
            raise OSError(28, "No space left on device")
        super().write(data)


async def test_lines_that_could_not_be_written_are_written_later_once(
        client: redis.asyncio.Redis, redis_server: RedisServer, tmp_path: Path) -> None:
    out = tmp_path / "audit.jsonl"
    sink = AuditSink(Shipment(redis.asyncio.Redis.from_url(redis_server.url), "flaky"), FailsOnce(str(out)))
    async with running(sink):
        await joined(client)
        await append(client, "first-try-fails")
        await wait_until_async(lambda: lines(out), 10, "the line")
        await append(client, "then-fine")
        await wait_until_async(lambda: len(lines(out)) >= 2, 10, "both lines")
        await asyncio.sleep(0.2)
    assert [line["execution_id"] for line in lines(out)] == ["first-try-fails", "then-fine"]


async def test_a_group_redis_lost_is_created_again(client: redis.asyncio.Redis, redis_server: RedisServer,
                                                   tmp_path: Path) -> None:
    out = tmp_path / "audit.jsonl"
    async with running(new_sink(redis_server.url, out)) as task:
        await joined(client)
        await append(client, "before-the-loss")
        await wait_until_async(lambda: lines(out), 10, "the first line")
        await client.flushall()  # as a Redis restarted without its data
        await joined(client)
        await append(client, "after-the-loss")
        await wait_until_async(lambda: len(lines(out)) >= 2, 10, "the line after the loss")
        assert not task.done()
    assert [line["execution_id"] for line in lines(out)] == ["before-the-loss", "after-the-loss"]


async def test_redis_out_of_reach_never_ends_the_loop(tmp_path: Path) -> None:
    async with running(new_sink(NO_REDIS, tmp_path / "audit.jsonl")) as task:
        await asyncio.sleep(0.5)  # a few failed attempts, with their backoff
        assert not task.done()
    assert not (tmp_path / "audit.jsonl").exists()
