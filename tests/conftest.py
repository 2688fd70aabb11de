from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from api.app import create_app
from api.settings import ApiSettings
from tests.support import RedisServer, Stack, new_tmp


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    workdir = new_tmp()
    server = RedisServer(workdir)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer) -> Iterator[Stack]:
    """Processes for one test module, against a flushed Redis."""
    client = redis_server.client()
    client.flushall()
    client.close()
    tmp = new_tmp()
    s = Stack(redis_server.url, tmp)
    yield s
    s.close()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def sync_redis(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


@contextlib.asynccontextmanager
async def app_client(settings: ApiSettings) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process client for ``create_app(settings)``, with its lifespan running."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://carmy.test") as client:
            yield client


@pytest.fixture
def tmp_dir(stack: Stack) -> Path:
    return stack.tmp


@pytest.fixture
def fresh_stack(redis_server: RedisServer) -> Iterator[Stack]:
    """Processes for one test only, against a flushed Redis (crash tests kill them)."""
    client = redis_server.client()
    client.flushall()
    client.close()
    tmp = new_tmp()
    s = Stack(redis_server.url, tmp)
    yield s
    s.close()
    shutil.rmtree(tmp, ignore_errors=True)
