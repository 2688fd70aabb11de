"""WorkerSettings.from_env: the README's worker settings."""

from __future__ import annotations

import pytest

from carmy_worker.settings import SettingsError, WorkerSettings


def test_max_result_bytes_defaults_to_one_mebibyte() -> None:
    assert WorkerSettings.from_env({}).max_result_bytes == 1_048_576
    assert WorkerSettings.from_env({"CARMY_MAX_RESULT_BYTES": "65536"}).max_result_bytes == 65536


@pytest.mark.parametrize("raw", ["0", "-1", "1MB"])
def test_max_result_bytes_must_be_a_positive_integer(raw: str) -> None:
    with pytest.raises(SettingsError, match="CARMY_MAX_RESULT_BYTES"):
        WorkerSettings.from_env({"CARMY_MAX_RESULT_BYTES": raw})


def test_cluster_nodes_are_read_alike_by_the_api_and_the_workers() -> None:
    from api.settings import ApiSettings

    env = {"CARMY_REDIS_CLUSTER_NODES": " 10.0.0.1:7000, redis-b:7001,,[::1]:7002 "}
    nodes = ("10.0.0.1:7000", "redis-b:7001", "[::1]:7002")
    assert WorkerSettings.from_env(env).redis_cluster_nodes == nodes
    assert ApiSettings.from_env(env).redis_cluster_nodes == nodes
    assert WorkerSettings.from_env({}).redis_cluster_nodes == ApiSettings.from_env({}).redis_cluster_nodes == ()


@pytest.mark.parametrize("raw", ["redis-a", "redis-a:", ":7000", "redis-a:70000", "redis-a:port"])
def test_a_cluster_node_needs_a_host_and_a_port(raw: str) -> None:
    with pytest.raises(SettingsError, match="CARMY_REDIS_CLUSTER_NODES"):
        WorkerSettings.from_env({"CARMY_REDIS_CLUSTER_NODES": f"10.0.0.1:7000,{raw}"})


@pytest.mark.parametrize(("nodes", "partitions"), [("", 1), (" , ", 1), ("10.0.0.1:7000,10.0.0.2:7000", 16)])
def test_partitions_default_to_sixteen_only_with_a_cluster_node_named(nodes: str, partitions: int) -> None:
    """A value of CARMY_REDIS_CLUSTER_NODES with no node in it is no cluster (the nodes' parser
    drops its empty items): the default partition count is one Redis's, not a cluster's."""
    assert WorkerSettings.from_env({"CARMY_REDIS_CLUSTER_NODES": nodes}).redis_partitions == partitions
