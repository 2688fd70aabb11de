"""The ``redis_cluster`` fixture: one local Redis Cluster (three primaries, three replicas) for
the whole session, started on first use. A test that kills or reshards leaves it whole again
(``LocalCluster.kill_primary`` then ``restart``), since the next test shares it.

``slow_to_fail_over`` is a cluster of a test's own, whose dead primary stays dead.

``cluster`` is an asyncio client of it as the API's and the workers' (``cluster_client`` makes
one with other bounds).

``cluster_stack`` starts the real API and worker processes against it (``ClusterStack``), with
``CARMY_REDIS_PARTITIONS`` taken from this run's environment (1 without it): the same tests then
run at any partition count. ``stack_beside_a_fault`` is one of 16 partitions on
``slow_to_fail_over``: the partitions of a primary killed or stopped are never served elsewhere,
and the others spread over the other primaries."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bench.localcluster import LocalCluster
from carmy_worker.store.cluster import StoreCluster
from carmy_worker.store.connect import RedisConnector
from tests.support import Stack, new_tmp

HERE = Path(__file__).parent

# The partition count the processes started here use (the environment's, as the lead's matrix sets it).
PARTITIONS = int(os.environ.get("CARMY_REDIS_PARTITIONS", "1"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.cluster)


@contextlib.contextmanager
def local_cluster(**options: int) -> Iterator[LocalCluster]:
    """A ``LocalCluster`` started in a directory of its own, stopped and removed after."""
    workdir = new_tmp()
    cluster = LocalCluster(workdir, **options)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """Six ``redis-server --cluster-enabled yes`` on loopback, joined and ``cluster_state:ok``;
    ``redis_cluster.nodes`` is the value of ``CARMY_REDIS_CLUSTER_NODES``."""
    with local_cluster() as cluster:
        yield cluster


# A node timeout far longer than any test: a primary killed is never failed over meanwhile.
NEVER_FAILS_OVER_MS = 60_000


@pytest.fixture
def slow_to_fail_over() -> Iterator[LocalCluster]:
    """A Redis Cluster of the test's own (three primaries, three replicas) whose primaries are
    never failed over within the test: one killed stays dead, so every call meets it dead."""
    with local_cluster(node_timeout_ms=NEVER_FAILS_OVER_MS) as cluster:
        yield cluster


def cluster_client(cluster: LocalCluster, *, max_connections: int = 8,
                   socket_timeout: float | None = 5.0) -> StoreCluster:
    """An asyncio client of ``cluster`` (``RedisConnector.cluster_client``): at most
    ``max_connections`` commands under way at once, a caller waiting up to 10 s for its turn."""
    connector = RedisConnector("redis://localhost/0", tuple(cluster.nodes.split(",")))
    return connector.cluster_client(max_connections=max_connections, wait=10.0, socket_connect_timeout=1.0,
                                    socket_timeout=socket_timeout)


@pytest.fixture
async def cluster(redis_cluster: LocalCluster) -> AsyncIterator[StoreCluster]:
    """A ``cluster_client`` of the session's cluster for one test."""
    client = cluster_client(redis_cluster)
    yield client
    await client.aclose()


class ClusterStack(Stack):
    """A ``Stack`` whose processes use the cluster (``CARMY_REDIS_CLUSTER_NODES``) with
    ``partitions`` partitions."""

    def __init__(self, cluster: LocalCluster, tmp: Path, partitions: int = PARTITIONS) -> None:
        super().__init__(cluster.url, tmp)
        self.cluster = cluster
        self.partitions = partitions

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return super().env({"CARMY_REDIS_CLUSTER_NODES": self.cluster.nodes,
                            "CARMY_REDIS_PARTITIONS": str(self.partitions), **(extra or {})})


def flush(cluster: LocalCluster) -> None:
    """Every primary emptied: the stack starts on a store of its own (the partition count, the
    roster of an earlier module's workers are gone)."""
    for server in cluster.primaries():
        with server.check_client() as client:
            client.flushall()


@contextlib.contextmanager
def cluster_stack_on(cluster: LocalCluster) -> Iterator[ClusterStack]:
    flush(cluster)
    tmp = new_tmp()
    stack = ClusterStack(cluster, tmp)
    try:
        yield stack
    finally:
        stack.close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster_stack(redis_cluster: LocalCluster) -> Iterator[ClusterStack]:
    """A ``ClusterStack`` for a module's tests, on the emptied cluster; none started yet."""
    with cluster_stack_on(redis_cluster) as stack:
        yield stack


@pytest.fixture
def fresh_cluster_stack(redis_cluster: LocalCluster) -> Iterator[ClusterStack]:
    """The same for one test (one that kills processes or nodes)."""
    with cluster_stack_on(redis_cluster) as stack:
        yield stack


# The partitions of ``stack_beside_a_fault``: spread over the three primaries (7/5/4 as created).
PARTITIONS_BESIDE_A_FAULT = 16


@pytest.fixture
def stack_beside_a_fault(slow_to_fail_over: LocalCluster) -> Iterator[ClusterStack]:
    """A ``ClusterStack`` of ``PARTITIONS_BESIDE_A_FAULT`` partitions on ``slow_to_fail_over``,
    none started yet."""
    flush(slow_to_fail_over)
    tmp = new_tmp()
    stack = ClusterStack(slow_to_fail_over, tmp, partitions=PARTITIONS_BESIDE_A_FAULT)
    try:
        yield stack
    finally:
        stack.close()
        shutil.rmtree(tmp, ignore_errors=True)
