"""``StoreMemory`` on a real cluster: each primary has its own ``maxmemory`` and holds its own
partitions, so the reading admission goes by is every primary's, and whichever one fills makes
new work refused (a reading of one node only would admit calls its full neighbour refuses)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest

from bench.localcluster import ClusterServer, LocalCluster
from carmy_worker.store import version
from carmy_worker.store.cluster import StoreCluster, as_redis
from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.memory import StoreMemory

HEADROOM = 0.5


@pytest.fixture
async def cluster(redis_cluster: LocalCluster) -> AsyncIterator[StoreCluster]:
    connector = RedisConnector("redis://localhost/0", tuple(redis_cluster.nodes.split(",")))
    client = connector.cluster_client(max_connections=2, wait=10.0, socket_connect_timeout=1.0, socket_timeout=5.0)
    yield client
    await client.aclose()


@contextlib.contextmanager
def nearly_full(server: ClusterServer) -> Iterator[None]:
    """``server``'s maxmemory set so that what it uses is past the headroom (but under the limit
    itself, so that nothing is refused by Redis), and set back to none after."""
    with server.check_client() as client:
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", used + used // 2)  # two thirds of it taken, over the half
        try:
            yield
        finally:
            client.config_set("maxmemory", 0)


async def test_any_primary_full_refuses_new_work(cluster: StoreCluster, redis_cluster: LocalCluster) -> None:
    memory = StoreMemory(as_redis(cluster), headroom=HEADROOM)
    assert not (await memory.read()).full and memory.room
    for server in redis_cluster.primaries():  # the client's default node or not: each one counts
        with nearly_full(server):
            reading = await memory.read()
            assert reading.full and not memory.room, server.address
            assert reading.limit > 0
        assert not (await memory.read()).full and memory.room


async def test_ready_reads_the_version_and_the_fullest_primary(cluster: StoreCluster,
                                                              redis_cluster: LocalCluster) -> None:
    memory = StoreMemory(as_redis(cluster), headroom=HEADROOM)
    last = redis_cluster.primaries()[-1]
    with nearly_full(last):
        found, reading = await memory.read_with_version()
    assert found is not None and not version.too_old(found)
    assert reading is not None and reading.full
