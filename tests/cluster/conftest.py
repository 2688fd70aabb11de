"""The ``redis_cluster`` fixture: one local Redis Cluster (three primaries, three replicas) for
the whole session, started on first use. A test that kills or reshards leaves it whole again
(``LocalCluster.kill_primary`` then ``restart``), since the next test shares it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.localcluster import LocalCluster
from tests.support import new_tmp

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """Six ``redis-server --cluster-enabled yes`` on loopback, joined and ``cluster_state:ok``;
    ``redis_cluster.nodes`` is the value of ``CARMY_REDIS_CLUSTER_NODES``."""
    workdir = new_tmp()
    cluster = LocalCluster(workdir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
