"""The catalog's refresh loop ends when cancelled, even as a change arrives at that moment
(Python 3.11's ``asyncio.wait_for`` swallowed such a cancellation, and an app's shutdown hung)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from api.calling.catalog import Catalog
from tests.support import RedisServer


async def test_a_catalog_loop_cancelled_as_a_change_comes_stops(redis_server: RedisServer) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    catalog = Catalog(client, "carmy", dead_after=3.0, refresh_interval=30.0)
    task = asyncio.create_task(catalog.run())
    try:
        for _ in range(500):  # until its first refresh is done and it waits for a change
            if catalog.reachable:
                break
            await asyncio.sleep(0.01)
        assert catalog.reachable
        catalog.notify()  # a worker came, in the same turn as the shutdown's cancel
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)  # not the next refresh, 30 s away
    finally:
        task.cancel()
        await client.aclose()
