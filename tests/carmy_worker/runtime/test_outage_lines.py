"""What a worker's loop says while Redis is out of reach: one line as it goes, one once Redis
answers again, nothing in between. With several partitions a turn of the loop can pass without
a command (no partition known to have work, so no LEASE before the wait): it used to say the
queue was reachable again each such turn, and unreachable again at the wait's failure, two lines
every retry. A real worker (arq's loop, the runtime, the store's scripts) in this process, on a
real Redis cut off and then reached again (through ``tests.proxy``: its connections reset and new
ones refused, the port kept)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from carmy_worker import Context, Toolbox
from carmy_worker.runtime import queue
from carmy_worker.runtime.runner import Runtime
from carmy_worker.settings import WorkerSettings
from tests.cells import partitions
from tests.proxy import CuttableProxy
from tests.support import private_redis, wait_until_async

GROUP = "outage"
WAIT_S = 30.0
TURNS_DOWN = 5  # turns of the loop while Redis is down: past the first retries' backoff
tools = Toolbox()


@tools.tool(effect="read", idempotent=True, timeout=5)
async def noop(ctx: Context) -> int:
    """Never called: a worker serves at least one tool."""
    return 0


def said(caplog: pytest.LogCaptureFixture, start: str) -> int:
    return sum(1 for r in caplog.records if r.name == "carmy.queue" and r.getMessage().startswith(start))


@pytest.mark.slow
@pytest.mark.parametrize("count", [1, 4])
async def test_an_outage_is_one_line_as_it_begins_and_one_as_it_ends(
        count: int, caplog: pytest.LogCaptureFixture) -> None:
    with private_redis() as server, partitions(count), caplog.at_level(logging.INFO, logger="carmy.queue"):
        proxy = CuttableProxy(server.port)
        await proxy.start()
        client = queue.connect(proxy.url, reply_timeout=1.0)
        runtime = Runtime(redis=client, tools={t.name: t for t in tools}, settings=WorkerSettings(concurrency=2),
                          worker_id="w-outage", group=GROUP)
        worker = queue.build_worker(runtime.handle, pool=client, worker_id="w-outage", group=GROUP,
                                    concurrency=2, max_timeout=30, drain_seconds=5, admit=runtime.admit,
                                    forget=runtime.forget)
        turns = 0
        start_due = worker._start_due

        async def counted(taken: Any) -> int:
            nonlocal turns
            turns += 1
            return await start_due(taken)

        worker._start_due = counted  # type: ignore[method-assign]
        before = asyncio.all_tasks()
        running = asyncio.create_task(worker.async_run())
        try:
            await wait_until_async(lambda: turns >= 2, WAIT_S, "the worker's loop turning")
            proxy.cut()
            down_at = turns
            await wait_until_async(lambda: turns >= down_at + TURNS_DOWN, WAIT_S, "the loop retrying")
            assert said(caplog, "queue unreachable") == 1
            assert said(caplog, "queue reachable again") == 0
            proxy.restore()
            await wait_until_async(lambda: said(caplog, "queue reachable again") == 1, WAIT_S,
                                   "the loop's line once Redis answers")
            assert said(caplog, "queue unreachable") == 1
        finally:
            proxy.restore()  # as it was, whatever failed
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            await worker.close()
            runtime.close()
            # A command given up on its deadline while Redis hung is still read to its end
            # (store.batch): let it end here, not be destroyed pending with the test's loop.
            left = asyncio.all_tasks() - before
            if left:
                await asyncio.wait(left, timeout=WAIT_S)
            await client.aclose(close_connection_pool=True)
            await proxy.close()
