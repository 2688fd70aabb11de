from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis
from hypothesis import HealthCheck, settings
from starlette.applications import Starlette

from api.app import create_app
from api.settings import ApiSettings
from carmy_worker.store import keys
from tests.cells import four_partitions  # noqa: F401 (a fixture for every test)
from tests.recordings import Recordings
from tests.support import RedisServer, Stack, new_tmp, private_redis

# Folders whose every test is marked ``e2e`` (pyproject.toml's markers): whole processes and
# outside clients, left out of the quick loop.
E2E_FOLDERS = tuple(Path(__file__).parent / name for name in ("e2e", "interop", "conformance"))

# Hypothesis judges its own pace by the clock: on a busy machine (four test processes on two
# cores) its too_slow health check failed a property that held. What is checked is the property.
settings.register_profile("carmy", suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("carmy")


def pytest_configure(config: pytest.Config) -> None:
    """The test process names its keys over ``CARMY_REDIS_PARTITIONS`` partitions when it is set
    (as the processes it starts do: ``Stack.env`` passes it on), before any test module names one."""
    count = os.environ.get("CARMY_REDIS_PARTITIONS")
    if count:
        keys.use_partitions(int(count))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.path.is_relative_to(folder) for folder in E2E_FOLDERS):
            item.add_marker(pytest.mark.e2e)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What importing and collecting made lives as long as the session: moved out of the cyclic
    collector's sight (``gc.freeze``), so that the collections the tests ask for (after each
    runtime test: ``tests/carmy_worker/runtime/conftest.py``) walk only what the tests made,
    not every module and test item again (a fifth of a second each, in the whole suite)."""
    gc.freeze()


@pytest.fixture(autouse=True)
def partition_count_kept() -> Iterator[None]:
    """Every test gives back the partition count it found (``tests.cells.partitions``): one left
    over would have the next tests, in this process, name their keys where its processes and
    apps do not look."""
    count = keys.partition_count()
    yield
    assert keys.partition_count() == count, f"the test left {keys.partition_count()} partitions, not {count}"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with private_redis() as server:
        yield server


@pytest.fixture(scope="session")
def script_recordings(tmp_path_factory: pytest.TempPathFactory) -> Recordings:
    """The store's script tests run again under ``tests/slotrecorder.py`` (``tests.recordings``)."""
    return Recordings(tmp_path_factory.mktemp("recordings"))


@pytest.fixture(scope="module")
def own_redis_server() -> Iterator[RedisServer]:
    """A redis-server of the module's own: for tests that change its maxmemory or its ACL."""
    with private_redis() as server:
        yield server


@pytest.fixture
def own_redis(own_redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of ``own_redis_server``, emptied and with no maxmemory before and after the test."""
    client = own_redis_server.client()
    client.config_set("maxmemory", 0)
    client.flushall()
    yield client
    client.config_set("maxmemory", 0)
    client.close()


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
def private_stack(*, durable: bool = False, fsync: str = "everysec") -> Iterator[tuple[RedisServer, Stack]]:
    """A redis-server of the test's own (which it may stop and start) and a Stack against it."""
    tmp = new_tmp()
    server = RedisServer(tmp, durable=durable, fsync=fsync)
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


# Seconds the app's lifespan may take to shut down (it takes milliseconds): past this, the test
# fails saying which of its tasks ignored their cancellation, instead of hanging until the
# 60 s test timeout.
SHUTDOWN_TIMEOUT = 20.0


@contextlib.asynccontextmanager
async def asgi_client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process client for ``app``, with its lifespan running."""
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            yield client
    finally:
        await shut_down(lifespan)


async def shut_down(lifespan: contextlib.AbstractAsyncContextManager[None]) -> None:
    exiting = asyncio.ensure_future(lifespan.__aexit__(None, None, None))
    done, _ = await asyncio.wait([exiting], timeout=SHUTDOWN_TIMEOUT)
    if done:
        exiting.result()
        return
    stuck = "; ".join(where(t) for t in asyncio.all_tasks() if t.cancelling() and t is not exiting)
    exiting.cancel()  # the gather in the lifespan cancels its tasks once more
    await asyncio.wait([exiting], timeout=5)
    raise AssertionError(f"the app's lifespan did not shut down within {SHUTDOWN_TIMEOUT:g} s; "
                         f"cancelled but still running: {stuck}")


def where(task: asyncio.Task[object]) -> str:
    frames = task.get_stack()
    place = f" at {frames[-1].f_code.co_filename}:{frames[-1].f_lineno}" if frames else ""
    return f"{getattr(task.get_coro(), '__qualname__', task.get_name())}{place}"


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
