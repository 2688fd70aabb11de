"""The hub's subscriptions when Redis goes away: refused at once, not after their timeout."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest
import redis.asyncio

from api.hub import SUBSCRIBE_TIMEOUT, EventHub, HubUnavailable
from tests.support import RedisServer, new_tmp, wait_until_async


async def test_a_subscription_waiting_when_the_connection_drops_fails_at_once() -> None:
    tmp = new_tmp()
    server = RedisServer(tmp)
    server.start()
    listener = redis.asyncio.Redis.from_url(server.url)
    hub = EventHub(listener)
    try:
        await hub.start()
        await wait_until_async(lambda: hub._pubsub is not None, what="the hub connected")
        with server.client() as control:
            control.client_pause(5000, all=True)  # the SUBSCRIBE goes out, its confirmation does not come

        async def subscribe() -> None:
            async with hub.subscribe("never-confirmed"):
                pass

        waiting = asyncio.ensure_future(subscribe())
        await wait_until_async(lambda: hub._confirms.get("never-confirmed"), what="a subscription waiting")
        dropped = time.monotonic()
        server.kill()
        with pytest.raises(HubUnavailable):
            await waiting
        assert time.monotonic() - dropped < SUBSCRIBE_TIMEOUT / 10
    finally:
        await hub.close()
        await listener.aclose()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
