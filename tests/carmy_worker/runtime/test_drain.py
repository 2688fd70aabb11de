"""A worker told to stop (SIGTERM, arq's ``handle_sig_wait_for_completion``) while it waits for
work: what the wait's LEASE claims for it as the drain begins is run to the end and drained,
not cancelled as it starts. arq's drain saw no running task, cancelled the worker's loop at once,
and the claimed job either never ran or was cancelled right after its tool was marked begun:
``EXECUTION_UNCERTAIN`` for a non-idempotent tool on a graceful stop (a scheduled occurrence
dead-lettered in ``bin/chaos --cluster``'s ``worker-term``). A real worker (arq's loop, the
runtime, the store's scripts) in this process, on a real Redis."""

from __future__ import annotations

import asyncio
import signal

import pytest
import redis
import redis.asyncio

from carmy_worker import Context, Toolbox
from carmy_worker.runtime import queue
from carmy_worker.runtime.runner import Runtime
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import keys
from carmy_worker.store.submit import Submit
from carmy_worker.wire import ExecutionJob, record_decoder
from tests.cells import one_partition  # noqa: F401 (a fixture)
from tests.support import RedisServer, wait_until_async

GROUP = "drain"
WAIT_S = 20.0
EFFECTS: list[str] = []  # the tool's side effect, outside Redis
tools = Toolbox()


@tools.tool(effect="write", idempotent=False, parallel_safe=True, timeout=30)
async def charge(ctx: Context) -> int:
    """Not idempotent: takes a moment, then has its effect once."""
    await asyncio.sleep(0.05)
    EFFECTS.append(ctx.execution_id)
    return len(EFFECTS)


def waiting(r: redis.Redis) -> int:
    """Connections blocked on a wake list right now."""
    return sum(1 for c in r.client_list() if c["cmd"] == "blpop" and "b" in c["flags"])


# One partition: over several, a worker's free slots are shared out among the partitions' waits
# (store.wakeups.claim_shares), and the job's partition may have no share in the round under way:
# its LEASE then takes nothing and puts the wake token back, and the job stays queued for a
# worker that is not draining.
@pytest.mark.usefixtures("one_partition")
async def test_a_job_claimed_by_the_wait_under_way_as_the_drain_begins_runs_to_its_end(
        sync_redis: redis.Redis, redis_server: RedisServer) -> None:
    sync_redis.flushall()
    EFFECTS.clear()
    client = queue.connect(redis_server.url)
    runtime = Runtime(redis=client, tools={t.name: t for t in tools}, settings=WorkerSettings(concurrency=2),
                      worker_id="w-drain", group=GROUP)
    worker = queue.build_worker(runtime.handle, pool=client, worker_id="w-drain", group=GROUP, concurrency=2,
                                max_timeout=30, drain_seconds=30, admit=runtime.admit, forget=runtime.forget)
    worker.poll_delay_s = 5.0  # a wait for work lasts until a job wakes it
    submitter = redis.asyncio.Redis.from_url(redis_server.url)
    await submitter.ping()  # connected: the SUBMIT below goes out in the same turn
    running = asyncio.create_task(worker.async_run())
    try:
        await wait_until_async(lambda: waiting(sync_redis) >= 1, WAIT_S, "the worker waiting for work")
        exec_id = keys.new_execution_id(0)
        job = ExecutionJob(execution_id=exec_id, tool="charge", arguments=b"{}")
        # The drain begins, and in the same breath a job wakes the wait: its LEASE claims it.
        worker.handle_sig_wait_for_completion(signal.SIGTERM)
        got = await Submit(submitter, retention=600)(job, group=GROUP, idempotent=False, workers_alive=True,
                                                     max_pending=100, queue_wait_ms=60_000, admission_ms=60_000)
        assert got.kind == "new"
        async with asyncio.timeout(WAIT_S):  # the drain ends once the job has
            await asyncio.gather(running, return_exceptions=True)
        raw = sync_redis.get(keys.record(exec_id))
        record = None if raw is None else record_decoder.decode(raw)
        assert record is not None and (record.status, record.error_code) == ("completed", None), record
        assert [exec_id] == EFFECTS  # run once, here, to its end
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await worker.close()
        runtime.close()
        await submitter.aclose()
        await client.aclose(close_connection_pool=True)
