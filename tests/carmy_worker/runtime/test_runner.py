"""Runtime.handle's last resort: whatever fails in the worker after the claim, the job ends with
a record (TOOL_PANIC), against the real Redis."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio

from carmy_worker import Context, Toolbox
from carmy_worker.runtime import runner
from carmy_worker.runtime.runner import Runtime
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import jobs, keys, records
from carmy_worker.store.submit import Submit
from carmy_worker.wire import ExecutionJob, msgpack_encoder, record_decoder
from tests.support import RedisServer

tools = Toolbox()


@tools.tool(effect="none")
async def fine(ctx: Context) -> int:
    """Returns 1."""
    return 1


@pytest.fixture
async def runtime(redis_server: RedisServer) -> AsyncIterator[Runtime]:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    rt = Runtime(redis=client, tools={t.name: t for t in tools}, settings=WorkerSettings(), worker_id="w-test")
    yield rt
    rt.close()
    await client.aclose()


async def handled(rt: Runtime) -> tuple[str, bytes]:
    """Submit an execution of ``fine`` and handle its job as arq would: its id and stored record."""
    exec_id = keys.new_execution_id()
    job = ExecutionJob(execution_id=exec_id, tool="fine", arguments=b"{}")
    await Submit(rt.redis, retention=600)(job, queue=jobs.queue_name("g"), idempotent=False, workers_alive=True,
                                          max_pending=10, queue_wait_ms=60_000, admission_ms=60_000)
    await rt.handle(msgpack_encoder.encode(job))
    raw = await rt.redis.get(keys.record(exec_id))
    assert raw is not None, "the job ended without a record"
    return exec_id, record_decoder.decode(raw).body


async def test_a_record_that_cannot_be_built_becomes_a_tool_panic(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in building the record")

    monkeypatch.setattr(records, "completed", broken)
    with caplog.at_level(logging.ERROR, logger="carmy.worker"):
        exec_id, body = await handled(runtime)
    assert body == records.panic(exec_id, "fine").body
    assert f"execution {exec_id}: its outcome could not be recorded" in caplog.text
    assert "a bug in building the record" in caplog.text


async def test_when_recording_the_panic_fails_too_it_is_still_recorded(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt  # even this, from the worker's own code

    async def record_fails(*args: Any, **kwargs: Any) -> bool:
        raise ValueError("the execution's log line, say")

    monkeypatch.setattr(records, "completed", broken)
    monkeypatch.setattr(runner.Runtime, "_record", record_fails)
    with caplog.at_level(logging.ERROR, logger="carmy.worker"):
        exec_id, body = await handled(runtime)
    assert body == records.panic(exec_id, "fine").body
    assert "recording TOOL_PANIC failed too; trying once more" in caplog.text
