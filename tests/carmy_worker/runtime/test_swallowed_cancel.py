"""A worker's loop stops when its task is cancelled, even when the call it was in swallowed the
cancellation: on Python 3.11 a cancel that comes as a call completes can be lost (the call
returns, or redis-py raises its own error instead), and the loop went on waiting for work for
ever, its stop with it. A real worker (arq's loop, the runtime, the store's scripts) on a real
Redis, its wait for work made to swallow the cancellation that comes while it waits."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from carmy_worker import Context, Toolbox
from carmy_worker.runtime import queue
from carmy_worker.runtime.runner import Runtime
from carmy_worker.settings import WorkerSettings
from tests.support import private_redis

GROUP = "swallowed"
tools = Toolbox()


@tools.tool(effect="read", idempotent=True, timeout=5)
async def noop(ctx: Context) -> int:
    """Never called: a worker serves at least one tool."""
    return 0


@pytest.mark.parametrize("swallowed_as", ["a return", "redis-py's error"])
async def test_a_cancellation_a_call_swallowed_still_stops_the_loop(swallowed_as: str) -> None:
    with private_redis() as server:
        client = queue.connect(server.url, reply_timeout=1.0)
        runtime = Runtime(redis=client, tools={t.name: t for t in tools}, settings=WorkerSettings(concurrency=2),
                          worker_id="w-swallowed", group=GROUP)
        worker = queue.build_worker(runtime.handle, pool=client, worker_id="w-swallowed", group=GROUP,
                                    concurrency=2, max_timeout=30, drain_seconds=5, admit=runtime.admit,
                                    forget=runtime.forget)
        waiting = asyncio.Event()

        async def swallowing_wait() -> None:
            waiting.set()
            try:
                await asyncio.sleep(30)  # the wait the cancellation comes in
            except asyncio.CancelledError:
                if swallowed_as == "a return":
                    return None
                raise RedisConnectionError("Timeout reading from the queue") from None
            return None

        worker._wait_for_work = swallowing_wait  # type: ignore[method-assign]
        running = asyncio.create_task(worker.async_run())
        try:
            await asyncio.wait_for(waiting.wait(), 30)
            running.cancel()
            # Not the 30 s of the next wait, nor for ever: within a turn or two of the loop.
            done, _ = await asyncio.wait([running], timeout=10)
            assert done, "the worker's loop went on after its cancellation"
            assert running.cancelled()
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            await worker.close()
            runtime.close()
            await client.aclose(close_connection_pool=True)
