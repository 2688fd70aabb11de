"""``Reads.ended`` (the recheck's one read, ``api/events/recheck.py``) on a real cluster: with
the executions of sixteen partitions spread over its three primaries, read in chunks of one
partition's, it finds exactly those that ended and those Redis lost."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from bench.localcluster import LocalCluster
from carmy_worker.store import keys
from carmy_worker.store.cluster import StoreCluster
from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.reads import Reads

PARTITIONS = 16


@pytest.fixture
def sixteen() -> Iterator[None]:
    before = keys.partition_count()
    keys.use_partitions(PARTITIONS)
    try:
        yield
    finally:
        keys.use_partitions(before)


@pytest.fixture
async def cluster(redis_cluster: LocalCluster) -> AsyncIterator[StoreCluster]:
    connector = RedisConnector("redis://localhost/0", tuple(redis_cluster.nodes.split(",")))
    client = connector.cluster_client(max_connections=2, wait=10.0, socket_connect_timeout=1.0, socket_timeout=5.0)
    yield client
    await client.aclose()


@pytest.mark.usefixtures("sixteen")
async def test_ended_reads_every_partition_on_its_own_node(cluster: StoreCluster, redis_cluster: LocalCluster) -> None:
    ids = [keys.new_execution_id(i % PARTITIONS) for i in range(200)]
    assert len({redis_cluster.owner(cluster.keyslot(keys.execution(e))).port for e in ids}) == 3
    for i, exec_id in enumerate(ids):
        if i % 7 != 3:  # every seventh one Redis lost: no hash at all
            await cluster.hset(keys.execution(exec_id), "state", "done" if i % 5 == 0 else "running")
    try:
        ended = await Reads(cluster).ended(ids, chunk=4)
        assert sorted(ended) == sorted(e for i, e in enumerate(ids) if i % 7 == 3 or i % 5 == 0)
    finally:
        for exec_id in ids:
            await cluster.delete(keys.execution(exec_id))
