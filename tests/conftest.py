from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import redis
from starlette.applications import Starlette

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


@contextlib.contextmanager
def flushed_stack(server: RedisServer) -> Iterator[Stack]:
    """A Stack against ``server`` after emptying it; its processes and files go afterwards."""
    client = server.client()
    client.flushall()
    client.close()
    tmp = new_tmp()
    s = Stack(server.url, tmp)
    try:
        yield s
    finally:
        s.close()
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def private_stack(*, durable: bool = False) -> Iterator[tuple[RedisServer, Stack]]:
    """A redis-server of the test's own (which it may stop and start) and a Stack against it."""
    tmp = new_tmp()
    server = RedisServer(tmp, durable=durable)
    server.start()
    s = Stack(server.url, tmp)
    try:
        yield server, s
    finally:
        s.close()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer) -> Iterator[Stack]:
    """Processes for one test module, against a flushed Redis."""
    with flushed_stack(redis_server) as s:
        yield s


@pytest.fixture
def sync_redis(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


@contextlib.asynccontextmanager
async def asgi_client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process client for ``app``, with its lifespan running."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            yield client


@contextlib.asynccontextmanager
async def app_client(settings: ApiSettings) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process client for ``create_app(settings)``, with its lifespan running."""
    async with asgi_client(create_app(settings)) as client:
        yield client


@pytest.fixture
def fresh_stack(redis_server: RedisServer) -> Iterator[Stack]:
    """Processes for one test only, against a flushed Redis (crash tests kill them)."""
    with flushed_stack(redis_server) as s:
        yield s
