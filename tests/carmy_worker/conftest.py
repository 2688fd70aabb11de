"""What the tests of the store and of the job loop share: an asyncio client on an emptied Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio

from tests.support import RedisServer


@pytest.fixture
async def ar(sync_redis: redis.Redis, redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """The asyncio client the wrappers run their scripts on, Redis emptied first."""
    sync_redis.flushall()
    client = redis.asyncio.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()
