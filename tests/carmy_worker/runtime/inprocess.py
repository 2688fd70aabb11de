"""A real worker (arq's loop, the runtime, the store's scripts) in the test's own process and
event loop, for tests of what its loop does: running once ``run`` starts it, and all of it closed
at the end, what it started included."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from carmy_worker import Context, Toolbox
from carmy_worker.runtime import queue
from carmy_worker.runtime.runner import Runtime
from carmy_worker.settings import WorkerSettings

WAIT_S = 30.0
tools = Toolbox()


@tools.tool(effect="read", idempotent=True, timeout=5)
async def noop(ctx: Context) -> int:
    """Never called: a worker serves at least one tool."""
    return 0


class InProcess:
    def __init__(self, worker: queue.WakeableWorker) -> None:
        self.worker = worker
        self.running: asyncio.Task[None] | None = None

    def run(self) -> asyncio.Task[None]:
        """arq's loop, in a task of its own."""
        self.running = asyncio.create_task(self.worker.async_run())
        return self.running


@contextlib.asynccontextmanager
async def worker_in_process(url: str, name: str) -> AsyncIterator[InProcess]:
    """A worker ``name`` of two slots on the Redis at ``url``, its group named ``name`` too."""
    client = queue.connect(url, reply_timeout=1.0)
    runtime = Runtime(redis=client, tools={t.name: t for t in tools}, settings=WorkerSettings(concurrency=2),
                      worker_id=name, group=name)
    worker = queue.build_worker(runtime.handle, pool=client, worker_id=name, group=name, concurrency=2,
                                max_timeout=30, drain_seconds=5, admit=runtime.admit, forget=runtime.forget)
    before = asyncio.all_tasks()
    held = InProcess(worker)
    try:
        yield held
    finally:
        if held.running is not None:
            held.running.cancel()
            await asyncio.gather(held.running, return_exceptions=True)
        await worker.close()
        runtime.close()
        # A command given up on its deadline while Redis hung is still read to its end
        # (store.batch): let it end here, not be destroyed pending with the test's loop.
        left = asyncio.all_tasks() - before - {asyncio.current_task()}
        if left:
            await asyncio.wait(left, timeout=WAIT_S)
        await client.aclose(close_connection_pool=True)
