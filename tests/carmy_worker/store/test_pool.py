"""The API's pool: callers get connections in the order they asked, and a loop that ran late
does not use up their patience."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError

from carmy_worker.store.patience import TICK
from carmy_worker.store.pool import StorePool
from tests.support import RedisServer, wait_until_async


@pytest.fixture
async def one_connection(redis_server: RedisServer) -> AsyncIterator[StorePool]:
    """A pool of one connection, whose callers wait up to 0.5 s."""
    pool = StorePool.from_url(redis_server.url, max_connections=1, timeout=0.5)
    yield pool
    await pool.disconnect()


async def test_connections_go_to_callers_in_the_order_they_asked(one_connection: StorePool) -> None:
    pool, served = one_connection, []
    held = await pool.get_connection()

    async def call(n: int) -> None:
        connection = await pool.get_connection()
        served.append(n)
        await asyncio.sleep(0)  # others may try to take it meanwhile
        await pool.release(connection)

    callers = []
    for n in range(5):
        callers.append(asyncio.ensure_future(call(n)))
        await wait_until_async(lambda n=n: len(pool._waiters) == n + 1, what="the caller queued")
    await pool.release(held)
    late = asyncio.ensure_future(call(5))  # asks after the release: still behind the queue
    await asyncio.gather(*callers, late)
    assert served == [0, 1, 2, 3, 4, 5]


async def test_a_released_connection_goes_to_the_oldest_waiter_not_to_a_newcomer(one_connection: StorePool) -> None:
    pool = one_connection
    held = await pool.get_connection()
    waiting = asyncio.ensure_future(pool.get_connection())
    await wait_until_async(lambda: pool._waiters, what="a caller queued")
    await pool.release(held)
    newcomer = asyncio.ensure_future(pool.get_connection())
    connection: AbstractConnection = await waiting
    assert connection is held and not newcomer.done()
    await pool.release(connection)
    await pool.release(await newcomer)


@pytest.mark.slow
async def test_a_late_loop_does_not_use_up_the_patience(one_connection: StorePool) -> None:
    pool = one_connection
    held = await pool.get_connection()
    waiting = asyncio.ensure_future(pool.get_connection())
    await wait_until_async(lambda: pool._waiters, what="a caller queued")
    time.sleep(3 * pool.timeout)  # the loop is busy elsewhere, three times the caller's patience
    # Three more ticks of the pool's clock, each of which refuses the callers that waited their
    # whole patience (a fraction of it, by that clock), unless the caller was refused already.
    back = pool._clock.now()
    await wait_until_async(lambda: waiting.done() or pool._clock.now() >= back + 3 * TICK,
                           what="three ticks of the pool's clock")
    await pool.release(held)
    assert await waiting is held
    await pool.release(held)


async def test_a_caller_that_waited_its_whole_patience_is_refused(one_connection: StorePool) -> None:
    pool = one_connection
    held = await pool.get_connection()
    with pytest.raises(ConnectionError, match="No connection available"):
        await pool.get_connection()
    assert not pool._waiters
    await pool.release(held)
    await pool.release(await pool.get_connection())  # the pool is whole


async def test_a_caller_cancelled_while_waiting_leaves_the_queue(one_connection: StorePool) -> None:
    pool = one_connection
    held = await pool.get_connection()
    waiting = asyncio.ensure_future(pool.get_connection())
    await wait_until_async(lambda: pool._waiters, what="a caller queued")
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert not pool._waiters
    await pool.release(held)
    await pool.release(await pool.get_connection())


async def test_a_connection_handed_to_a_caller_that_just_left_is_passed_on(one_connection: StorePool) -> None:
    pool = one_connection
    held = await pool.get_connection()
    leaving = asyncio.ensure_future(pool.get_connection())
    await wait_until_async(lambda: pool._waiters, what="a caller queued")
    next_one = asyncio.ensure_future(pool.get_connection())
    await wait_until_async(lambda: len(pool._waiters) == 2, what="a second caller queued")
    await pool.release(held)  # handed to the first caller...
    leaving.cancel()  # ...which is cancelled before it could take it
    await asyncio.gather(leaving, return_exceptions=True)
    assert await next_one is held
    await pool.release(held)
