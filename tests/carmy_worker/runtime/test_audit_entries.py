"""The audit trail (store.audit), against the real Redis: every way an execution finishes leaves
one entry, written by the script that writes its record; a replay leaves one of its own; reads
filter and page newest first; the janitor's trim keeps the trail within its bounds."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import msgspec
import pytest
import redis.asyncio

from carmy_worker import Context, Toolbox, ToolError
from carmy_worker.runtime.runner import Runtime
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import keys, records
from carmy_worker.store.audit import AuditFilter, AuditTrail, is_cursor
from carmy_worker.store.submit import Submit
from carmy_worker.store.verdicts import Verdicts
from carmy_worker.wire import ExecutionJob, msgpack_encoder, record_decoder
from tests.support import RedisServer

tools = Toolbox()


class Ask(msgspec.Struct):
    fail: bool = False
    note: str = ""


@tools.tool(effect="read", idempotent=True)
async def lookup(ctx: Context, args: Ask) -> int:
    """Returns 1, or fails with a retryable error."""
    if args.fail:
        raise ToolError("UPSTREAM_UNAVAILABLE", "down", retryable=True)
    return 1


@pytest.fixture
async def runtime(redis_server: RedisServer) -> AsyncIterator[Runtime]:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    await client.flushall()
    rt = Runtime(redis=client, tools={t.name: t for t in tools}, settings=WorkerSettings(), worker_id="w-audit")
    yield rt
    rt.close()
    await client.aclose()


async def submitted(rt: Runtime, *, arguments: bytes = b"{}", request_id: str | None = "r-1",
                    principal: str | None = "alice", via: str = "mcp") -> tuple[str, bytes]:
    # Drawn where its request id's idempotency key is, as the API draws it (api/calling/calls.py).
    exec_id = keys.new_execution_id(keys.request_partition(principal, None, request_id))
    job = ExecutionJob(execution_id=exec_id, tool="lookup", arguments=arguments, request_id=request_id,
                       principal=principal)
    sub = await Submit(rt.redis, retention=600)(
        job, group="g", idempotent=True, workers_alive=True, max_pending=10,
        queue_wait_ms=60_000, admission_ms=60_000, via=via, effect="read")
    assert sub.kind == "new"
    return exec_id, msgpack_encoder.encode(job)


async def test_a_completed_execution_leaves_one_entry_with_what_an_operator_needs(runtime: Runtime) -> None:
    before_ms = int(time.time() * 1000)
    exec_id, payload = await submitted(runtime)
    await runtime.handle(payload)
    page = await AuditTrail(runtime.redis).page()
    [entry] = page.entries
    assert (entry.execution_id, entry.request_id, entry.principal, entry.tool, entry.effect, entry.status,
            entry.error_code, entry.via, entry.worker, entry.replayed, entry.job_id) == (
        exec_id, "r-1", "alice", "lookup", "read", "completed", None, "mcp", "w-audit", False, None)
    assert entry.duration_ms is not None and entry.duration_ms >= 0
    assert entry.queued_ms is not None and entry.queued_ms >= 0
    assert entry.started_at is not None and entry.finished_at >= entry.started_at
    assert int(entry.id.split("-")[0]) >= before_ms - 1000 and is_cursor(entry.id)
    assert page.cursor is None  # nothing older


async def test_a_failure_names_its_error_and_never_its_arguments_or_output(runtime: Runtime) -> None:
    _, payload = await submitted(runtime, arguments=b'{"fail":true,"note":"s3cr3t"}')
    await runtime.handle(payload)
    [entry] = (await AuditTrail(runtime.redis).page()).entries
    assert (entry.status, entry.error_code) == ("failed", "UPSTREAM_UNAVAILABLE")
    [(_, fields)] = await runtime.redis.xrange(keys.audit(keys.partition_of(entry.execution_id)))
    written = b" ".join(fields.values())
    assert b"s3cr3t" not in written and b"down" not in written


async def test_an_execution_cancelled_before_it_started_has_its_entry_without_a_worker(runtime: Runtime) -> None:
    exec_id, _ = await submitted(runtime, via="http")
    assert await Verdicts(runtime.redis, retention=600).cancel(exec_id, "lookup") == "cancelled"
    [entry] = (await AuditTrail(runtime.redis).page()).entries
    assert (entry.execution_id, entry.status, entry.error_code, entry.worker, entry.started_at, entry.via) == (
        exec_id, "cancelled", "CANCELLED", None, None, "http")
    assert entry.queued_ms is not None


async def test_a_replay_has_an_entry_of_its_own_marked_replayed(runtime: Runtime) -> None:
    exec_id, payload = await submitted(runtime)
    await runtime.handle(payload)
    record = record_decoder.decode(await runtime.redis.get(keys.record(exec_id)))
    await AuditTrail(runtime.redis).replayed(exec_id, record, via="http")
    newest, first = (await AuditTrail(runtime.redis).page()).entries
    assert (newest.execution_id, newest.replayed, newest.via, newest.status, newest.queued_ms) == (
        exec_id, True, "http", "completed", None)
    assert (first.execution_id, first.replayed, first.via) == (exec_id, False, "mcp")


async def test_pages_filter_and_go_on_from_their_cursor(runtime: Runtime) -> None:
    made = []
    for i in range(7):
        exec_id, payload = await submitted(runtime, request_id=f"r-{i}", principal="bob" if i % 2 else "alice",
                                           arguments=b'{"fail":true}' if i == 3 else b"{}")
        await runtime.handle(payload)
        made.append(exec_id)
    trail = AuditTrail(runtime.redis)
    first = await trail.page(limit=3)
    assert [e.execution_id for e in first.entries] == made[::-1][:3] and first.cursor is not None
    second = await trail.page(limit=3, cursor=first.cursor)
    assert [e.execution_id for e in second.entries] == made[::-1][3:6]
    bobs = await trail.page(AuditFilter(principal="bob"), limit=10)
    assert [e.execution_id for e in bobs.entries] == [made[5], made[3], made[1]] and bobs.cursor is None
    failed = await trail.page(AuditFilter(status="failed"))
    assert [e.execution_id for e in failed.entries] == [made[3]]
    one = await trail.page(AuditFilter(execution_id=made[2]))
    assert [e.execution_id for e in one.entries] == [made[2]]
    # A scan that stops early hands back where it stopped.
    short = await trail.page(AuditFilter(tool="nothing"), scan_at_most=4)
    assert short.entries == [] and short.cursor is not None
    rest = await trail.page(AuditFilter(tool="nothing"), cursor=short.cursor)
    assert rest.entries == [] and rest.cursor is None
    newest_ms = int(first.entries[0].id.split("-")[0])
    assert (await trail.page(AuditFilter(since_ms=newest_ms + 10_000))).entries == []
    assert len((await trail.page(AuditFilter(until_ms=newest_ms))).entries) == 7


async def test_the_trim_keeps_the_newest_within_count_and_age(runtime: Runtime) -> None:
    r = runtime.redis
    old_ms = int(time.time() * 1000) - 3_600_000  # an hour ago
    for i in range(300):
        await r.xadd(keys.audit(0), {"execution_id": f"old-{i}"}, id=f"{old_ms}-{i}")
    for i in range(10):
        await r.xadd(keys.audit(0), {"execution_id": f"new-{i}"})
    trail = AuditTrail(r)
    await trail.trim(max_entries=100_000, retention_s=600)
    left = [f[b"execution_id"].decode() for _, f in await r.xrange(keys.audit(0))]
    assert [e for e in left if e.startswith("new-")] == [f"new-{i}" for i in range(10)]
    assert len(left) < 200  # whole nodes of old entries went (approximate: ~)
    for i in range(1000):
        await r.xadd(keys.audit(0), {"execution_id": f"more-{i}"})
    await trail.trim(max_entries=100, retention_s=600)
    left = [f[b"execution_id"].decode() for _, f in await r.xrange(keys.audit(0))]
    share = keys.share(100)  # the stream's part of the trail's bound
    assert share <= len(left) < share + 300 and left[-1] == "more-999"


def test_records_labels_carry_status_and_code_the_entry_reads() -> None:
    record = records.failed("exec_x", "a\u00e9tool", records.panic_error())
    from carmy_worker.store.metrics import label
    assert label(record).split("\x1f") == ["a\u00e9tool", "failed", "TOOL_PANIC"]
