"""Runtime: one job claimed, run and settled by a worker, against the real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from carmy_worker import Context, Toolbox
from carmy_worker.runtime.runner import Runtime
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import jobs, keys
from carmy_worker.store.submit import Submit
from carmy_worker.wire import ExecutionJob, msgpack_encoder, record_decoder
from tests.support import RedisServer

tools = Toolbox()
started: list[str] = []


@tools.tool(effect="none", timeout=20)
async def waits(ctx: Context) -> None:
    """Waits until cancelled."""
    started.append(ctx.execution_id)
    await asyncio.sleep(20)


@pytest.fixture
async def ar(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    await client.flushall()
    yield client
    await client.aclose()


async def queued(ar: redis.asyncio.Redis, exec_id: str) -> bytes:
    job = ExecutionJob(execution_id=exec_id, tool="waits", arguments=b"{}")
    submitted = await Submit(ar, retention=60)(job, queue=jobs.queue_name("g"), idempotent=False, workers_alive=True,
                                                max_pending=10, queue_wait_ms=60_000, admission_ms=120_000)
    assert submitted.kind == "new"
    return msgpack_encoder.encode(job)


async def test_a_cancel_heard_before_the_execution_started_here_is_not_lost(ar: redis.asyncio.Redis) -> None:
    # The API's CANCEL found the execution running (this worker's CLAIM went first) and told every
    # worker; the message reached this one before its own CLAIM reply did.
    runtime = Runtime(redis=ar, tools={t.name: t for t in tools}, settings=WorkerSettings(), worker_id="w1")
    exec_id = keys.new_execution_id()
    payload = await queued(ar, exec_id)
    runtime.cancel(exec_id)
    await asyncio.wait_for(runtime.handle(payload), 5)  # not the tool's 20 s
    record = record_decoder.decode(await ar.get(keys.record(exec_id)))
    assert (record.status, record.error_code) == ("cancelled", "CANCELLED")
    runtime.close()


async def test_cancels_of_executions_that_never_come_here_are_forgotten(ar: redis.asyncio.Redis) -> None:
    runtime = Runtime(redis=ar, tools={t.name: t for t in tools}, settings=WorkerSettings(), worker_id="w1")
    for i in range(1000):
        runtime.cancel(f"exec_elsewhere_{i}")
    assert len(runtime._early_cancels) == 1000  # all within the memory window
    runtime._early_cancels.update((k, 0.0) for k in list(runtime._early_cancels))  # heard long ago
    runtime.cancel("exec_now")
    assert list(runtime._early_cancels) == ["exec_now"]
    runtime.close()
