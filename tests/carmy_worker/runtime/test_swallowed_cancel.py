"""A worker's loop stops when its task is cancelled, even when the call it was in swallowed the
cancellation: on Python 3.11 a cancel that comes as a call completes can be lost (the call
returns, or redis-py raises its own error instead), and the loop went on waiting for work for
ever, its stop with it. A real worker (arq's loop, the runtime, the store's scripts) on a real
Redis, its wait for work made to swallow the cancellation that comes while it waits."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.carmy_worker.runtime.inprocess import worker_in_process
from tests.support import private_redis


@pytest.mark.parametrize("swallowed_as", ["a return", "redis-py's error"])
async def test_a_cancellation_a_call_swallowed_still_stops_the_loop(swallowed_as: str) -> None:
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

    with private_redis() as server:
        async with worker_in_process(server.url, "w-swallowed") as held:
            held.worker._wait_for_work = swallowing_wait  # type: ignore[method-assign]
            running = held.run()
            await asyncio.wait_for(waiting.wait(), 30)
            running.cancel()
            # Not the 30 s of the next wait, nor for ever: within a turn or two of the loop.
            done, _ = await asyncio.wait([running], timeout=10)
            assert done, "the worker's loop went on after its cancellation"
            assert running.cancelled()
