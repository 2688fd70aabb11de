"""CARMY_REDIS_URL's forms, and the refusal of one that cannot be used, naming the setting."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from carmy_worker.settings import SettingsError
from carmy_worker.store.cluster import StoreCluster
from carmy_worker.store.connect import RedisConnector, SentinelTarget
from carmy_worker.store.pool import StorePool


def test_a_sentinel_url_names_its_sentinels_service_database_and_passwords() -> None:
    connector = RedisConnector("redis+sentinel://:s%40cret@10.0.0.1:26380,sentinel-b,[::1]:26381/cache/2"
                               "?sentinel_password=other")
    assert connector.sentinel == SentinelTarget(
        sentinels=(("10.0.0.1", 26380), ("sentinel-b", 26379), ("::1", 26381)), service="cache", db=2,
        password="s@cret", sentinel_password="other")


def test_a_sentinel_client_asks_the_sentinels_and_keeps_its_options() -> None:
    client = RedisConnector("redis+sentinel://127.0.0.1:1/cache/1").store_client(
        max_connections=3, wait=5.0, socket_timeout=1.0)
    pool = client.connection_pool
    assert isinstance(pool, StorePool)
    assert (pool.max_connections, pool.timeout) == (3, 5.0)
    assert pool.connection_kwargs["db"] == 1 and pool.connection_kwargs["socket_timeout"] == 1.0


@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "rediss://:pw@redis.example:6380/1",
                                 "unix:///run/redis.sock?db=2"])
def test_one_server_urls_are_redis_pys(url: str) -> None:
    assert RedisConnector(url).sentinel is None


@pytest.mark.parametrize(("url", "why"), [
    ("http://localhost:6379", "schemes"),
    ("redis://localhost:port/0", "Port"),
    ("redis+sentinel://localhost:26379", "service name"),
    ("redis+sentinel://localhost:26379/cache/zero", "database must be a number"),
    ("redis+sentinel:///cache", "no Sentinel host"),
    ("redis+sentinel://localhost:99999/cache", "not a port"),
    ("redis+sentinel://localhost:²/cache", "not a port"),  # a digit to str.isdigit(), none to int()
    ("redis+sentinel://localhost/cache?master=x", "unknown option"),
])
def test_an_unusable_url_is_refused_naming_the_setting(url: str, why: str) -> None:
    with pytest.raises(SettingsError, match="CARMY_REDIS_URL") as raised:
        RedisConnector(url)
    assert why in str(raised.value)


def test_cluster_nodes_take_the_urls_password_and_tls_not_its_host() -> None:
    connector = RedisConnector("rediss://carmy:s%40cret@ignored:6379/0?ssl_cert_reqs=none",
                               ("10.0.0.1:7000", "redis-b:7001", "[::1]:7002"))
    target = connector.cluster
    assert target is not None and connector.is_cluster and connector.sentinel is None
    assert target.nodes == (("10.0.0.1", 7000), ("redis-b", 7001), ("::1", 7002))
    assert target.tls and target.options["username"] == "carmy" and target.options["password"] == "s@cret"
    assert target.options["ssl_cert_reqs"] == "none"
    client = connector.cluster_client(max_connections=4, wait=2.0, socket_timeout=1.0)
    assert client.connection_kwargs["password"] == "s@cret" and client.connection_kwargs["socket_timeout"] == 1.0
    assert [n.port for n in client.nodes_manager.startup_nodes.values()] == [7000, 7001, 7002]


async def test_on_a_cluster_every_client_is_a_cluster_client_and_there_is_no_single_pool() -> None:
    """The API and the workers ask for their clients alike on one Redis and on a cluster."""
    connector = RedisConnector("redis://localhost:6379/0", ("127.0.0.1:1",))
    with pytest.raises(SettingsError, match="CARMY_REDIS_CLUSTER_NODES"):
        connector.pool()
    for client in (connector.client(), connector.store_client(max_connections=2, wait=1.0)):
        assert isinstance(client, StoreCluster)
        await client.aclose(close_connection_pool=True)  # as the API closes its clients
    # The synchronous one is made on its first command: a cluster unreachable then is that
    # command's connection error, as one Redis's would be, not the maker's.
    client = connector.sync_client(socket_connect_timeout=0.5)
    with pytest.raises(RedisConnectionError):
        client.ping()
    client.close()
    with pytest.raises(RuntimeError, match="not set"):
        RedisConnector("redis://localhost:6379/0").cluster_client(max_connections=2)


@pytest.mark.parametrize(("url", "why"), [
    ("redis+sentinel://localhost:26379/cache", "redis:// or rediss://"),
    ("unix:///run/redis.sock", "redis:// or rediss://"),
    ("redis://localhost:6379/2", "database 0 only"),
])
def test_a_url_that_cannot_serve_a_cluster_is_refused_naming_both_settings(url: str, why: str) -> None:
    with pytest.raises(SettingsError, match="CARMY_REDIS_URL cannot be used with CARMY_REDIS_CLUSTER_NODES") as raised:
        RedisConnector(url, ("127.0.0.1:7000",))
    assert why in str(raised.value)


async def test_an_unreachable_cluster_is_a_connection_error_not_a_bug() -> None:
    """redis-py says "no seed answers" with RedisClusterException, no RedisError: Carmy's loops,
    which reconnect on RedisError, would stop on it."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    client = RedisConnector("redis://localhost/0", ("127.0.0.1:1",)).cluster_client(
        max_connections=2, socket_connect_timeout=1.0)
    try:
        with pytest.raises(RedisConnectionError, match="cannot be connected"):
            await client.get("key")
    finally:
        await client.aclose()
