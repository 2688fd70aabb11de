"""WorkerSettings.from_env: the README's worker settings."""

from __future__ import annotations

import pytest

from carmy_worker.settings import MAX_SECONDS, SettingsError, WorkerSettings


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


# "²" is a digit to str.isdigit() and none to int(): refused as a setting, not a traceback.
@pytest.mark.parametrize("raw", ["redis-a", "redis-a:", ":7000", "redis-a:70000", "redis-a:port", "redis-a:²"])
def test_a_cluster_node_needs_a_host_and_a_port(raw: str) -> None:
    with pytest.raises(SettingsError, match="CARMY_REDIS_CLUSTER_NODES"):
        WorkerSettings.from_env({"CARMY_REDIS_CLUSTER_NODES": f"10.0.0.1:7000,{raw}"})


@pytest.mark.parametrize(("nodes", "partitions"), [("", 1), (" , ", 1), ("10.0.0.1:7000,10.0.0.2:7000", 16)])
def test_partitions_default_to_sixteen_only_with_a_cluster_node_named(nodes: str, partitions: int) -> None:
    """A value of CARMY_REDIS_CLUSTER_NODES with no node in it is no cluster (the nodes' parser
    drops its empty items): the default partition count is one Redis's, not a cluster's."""
    assert WorkerSettings.from_env({"CARMY_REDIS_CLUSTER_NODES": nodes}).redis_partitions == partitions


# Every duration setting, with the process that reads it (api, worker or both).
DURATIONS = [
    ("CARMY_RETENTION", "both"), ("CARMY_JOBS_RETENTION", "both"), ("CARMY_DEAD_LETTER_RETENTION", "both"),
    ("CARMY_REDIS_WAIT_TIMEOUT", "both"), ("CARMY_QUEUE_TIMEOUT", "api"), ("CARMY_HEADER_TIMEOUT", "api"),
    ("CARMY_BODY_TIMEOUT", "api"), ("CARMY_MCP_TASK_AFTER", "api"), ("CARMY_JOBS_HORIZON", "api"),
    ("CARMY_CONSOLE_SESSION", "api"), ("CARMY_NOTIFY_WINDOW", "both"), ("CARMY_AUDIT_RETENTION", "both"),
]


def _read_by(process: str, env: dict[str, str]) -> None:
    from api.settings import ApiSettings

    if process in ("api", "both"):
        ApiSettings.from_env(env)
    if process in ("worker", "both"):
        WorkerSettings.from_env(env)


@pytest.mark.parametrize(("name", "process"), DURATIONS)
def test_a_duration_past_a_century_is_refused_at_start(name: str, process: str) -> None:
    """1e20 s was taken, and every SUBMIT then failed (its milliseconds past Redis's integers)."""
    century = MAX_SECONDS * (1000 if name == "CARMY_REDIS_WAIT_TIMEOUT" else 1)
    _read_by(process, {name: str(century)})
    for raw in (str(century + 1), "99999999999999999999", "1e20"):
        with pytest.raises(SettingsError, match=f"{name} must be (at most|an integer)"):
            _read_by(process, {name: raw})


def test_the_default_timeout_is_at_most_a_tools_own() -> None:
    """A tool's own ``timeout`` is at most a day: so is the default for those without one."""
    assert WorkerSettings.from_env({"CARMY_DEFAULT_TIMEOUT": "86400"}).default_timeout == 86400
    with pytest.raises(SettingsError, match="CARMY_DEFAULT_TIMEOUT must be at most 86400"):
        WorkerSettings.from_env({"CARMY_DEFAULT_TIMEOUT": "86401"})


def test_a_workers_concurrency_is_at_most_a_million() -> None:
    """Its info carries the number: 1e20 stopped the worker with an OverflowError at start."""
    assert WorkerSettings.from_env({"CARMY_CONCURRENCY": "1000000"}).concurrency == 1_000_000
    with pytest.raises(SettingsError, match="CARMY_CONCURRENCY must be at most 1000000"):
        WorkerSettings.from_env({"CARMY_CONCURRENCY": "99999999999999999999"})
