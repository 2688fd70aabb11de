"""Clients for ``CARMY_REDIS_URL``: the one place that turns the setting into connections, for
the API, the workers and the health check alike.

Three forms reach one server: ``redis://`` (``rediss://`` for TLS) and ``unix://``, as redis-py
reads them. A fourth reaches whichever server a set of Redis Sentinels names as the primary of a
service::

    redis+sentinel://[[user]:password@]host1:26379,host2:26379,host3:26379/<service>[/<db>]

The password is the data servers' (``requirepass``); Sentinels that require one of their own get
it as ``?sentinel_password=...``. A host without a port means 26379. With Sentinel, each new
connection asks the Sentinels for the primary (redis-py's ``SentinelConnectionPool``); a
connection that finds its server demoted (``READONLY``) is closed and reported as a connection
error, and Sentinel closes the clients of a server it demotes. Carmy's loops all treat a
connection error as "reconnect and go on", so after a failover they end up on the new primary.

A Redis Cluster is named by ``CARMY_REDIS_CLUSTER_NODES`` (seeds, ``host:port,host:port``);
``CARMY_REDIS_URL`` then only gives what every node's connections take: its password (and
user), TLS with ``rediss://`` and the ``ssl_*`` options of its query; its host and port are
not used, its database must be 0, and ``unix://`` and ``redis+sentinel://`` are refused. One
password for every node, as a cluster has. The cluster's clients are ``cluster_client`` and
``sync_cluster_client`` (``store.cluster``), and ``client``, ``store_client`` and ``sync_client``
make them when the setting names a cluster: the API, the workers and the health check ask for
their clients the same way on one Redis and on a cluster. Only ``pool`` (one server's pool) has
no cluster form.
"""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.cluster
import redis.sentinel
from msgspec import Struct
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import parse_url
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from carmy_worker.settings import SettingsError
from carmy_worker.store.checkout import QuickCheckout
from carmy_worker.store.cluster import (
    ClusterTarget,
    LazySyncCluster,
    StoreCluster,
    as_redis,
    cluster_target,
    sync_cluster,
)
from carmy_worker.store.packing import packed_by_hiredis
from carmy_worker.store.pool import StorePool
from carmy_worker.wire import is_digits

SENTINEL_SCHEME = "redis+sentinel"
SENTINEL_PORT = 26379
# Asking a Sentinel for the primary is bounded even for connections that have no read timeout
# (pub/sub): a Sentinel that does not answer must not hold up a reconnection.
SENTINEL_TIMEOUTS = {"socket_connect_timeout": 0.5, "socket_timeout": 1.0}
# Commands under way at once on a cluster client that has no bound of its own (``client``): a
# one-server pool opens a connection per command under way, without limit.
UNBOUNDED = 2**31


class SentinelTarget(Struct, frozen=True):
    """A ``redis+sentinel://`` URL, parsed."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


class Pool(QuickCheckout, ConnectionPool):
    """An unbounded pool whose connections are checked without a read (``store.checkout``)."""


class SentinelManagedPool(QuickCheckout, SentinelConnectionPool):
    """The same, over the primary the Sentinels name."""

    def __init__(self, service: str, manager: Sentinel, **options: Any) -> None:
        super().__init__(service, manager, **options)  # type: ignore[no-untyped-call]  # redis-py unannotated


class SentinelPool(SentinelConnectionPool, StorePool):
    """The API's bounded pool (``StorePool``), over the primary the Sentinels name."""

    def __init__(self, service: str, manager: Sentinel, **options: Any) -> None:
        super().__init__(service, manager, **options)  # type: ignore[no-untyped-call]  # redis-py unannotated


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The parts of a ``redis+sentinel://`` URL; ValueError says what is wrong."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    sentinels = tuple(_host_port(item) for item in hosts.split(",") if item.strip())
    if not sentinels:
        raise ValueError("no Sentinel host")
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError("the path must be /<service name> or /<service name>/<db>")
    try:
        db = int(path[1]) if len(path) == 2 else 0
    except ValueError:
        raise ValueError(f"the database must be a number, got {path[1]!r}") from None
    query = parse_qs(parts.query)
    unknown = set(query) - {"sentinel_password"}
    if unknown:
        raise ValueError(f"unknown option {sorted(unknown)[0]!r}")
    sentinel_password = query.get("sentinel_password", [None])[0]
    return SentinelTarget(sentinels=sentinels, service=path[0], db=db, username=unquote(username) or None,
                          password=unquote(password) or None, sentinel_password=sentinel_password)


def _host_port(item: str) -> tuple[str, int]:
    host, port = item.strip(), SENTINEL_PORT
    if host.startswith("["):  # [::1]:26379
        end = host.index("]")
        host, rest = host[1:end], host[end + 1:]
        if rest:
            port = _port(rest.removeprefix(":"))
    elif ":" in host:
        host, raw = host.rsplit(":", 1)
        port = _port(raw)
    if not host:
        raise ValueError(f"a Sentinel address has no host: {item!r}")
    return host, port


def _port(raw: str) -> int:
    if not is_digits(raw) or not 0 < int(raw) < 65536:
        raise ValueError(f"not a port: {raw!r}")
    return int(raw)


class RedisConnector:
    """Clients for one ``CARMY_REDIS_URL`` (and ``CARMY_REDIS_CLUSTER_NODES``, ``cluster_nodes``).
    Built at start: an unusable value raises ``SettingsError`` naming the setting. Building
    clients connects nothing; connections open on first use."""

    def __init__(self, url: str, cluster_nodes: tuple[str, ...] = ()) -> None:
        self.url = url
        self.sentinel: SentinelTarget | None = None
        self.cluster: ClusterTarget | None = None
        try:
            if cluster_nodes:
                self.cluster = cluster_target(url, cluster_nodes)
            elif url.startswith(SENTINEL_SCHEME + "://"):
                self.sentinel = parse_sentinel_url(url)
            else:
                parse_url(url)  # what redis-py would refuse on first use
        except ValueError as exc:
            if cluster_nodes:
                raise SettingsError(f"CARMY_REDIS_URL cannot be used with CARMY_REDIS_CLUSTER_NODES ({exc})") from None
            raise SettingsError(f"CARMY_REDIS_URL cannot be used ({exc}); expected redis://, rediss://, "
                                f"unix:// or {SENTINEL_SCHEME}://host:port,host:port/<service>") from None

    @property
    def is_cluster(self) -> bool:
        return self.cluster is not None

    def cluster_client(self, *, max_connections: int, wait: float | None = None, **options: Any) -> StoreCluster:
        """An asyncio client of the cluster: at most ``max_connections`` commands under way at
        once (so at most that many connections to any node), a caller waiting up to ``wait``
        seconds for its turn (``store.cluster``). Connects on first use."""
        target = self._cluster_target()
        nodes = [ClusterNode(host, port) for host, port in target.nodes]
        return StoreCluster(startup_nodes=nodes, max_connections=max_connections, wait=wait,  # type: ignore[abstract]
                            **{**target.options, **options})  # (redis-py's stubs: connection_pool)

    def sync_cluster_client(self, **options: Any) -> redis.cluster.RedisCluster:
        """A synchronous client of the cluster (the heartbeat thread, the health check)."""
        return sync_cluster(self._cluster_target(), **options)

    def _cluster_target(self) -> ClusterTarget:
        if self.cluster is None:
            raise RuntimeError("no Redis Cluster: CARMY_REDIS_CLUSTER_NODES is not set")
        return self.cluster

    def pool(self, **options: Any) -> ConnectionPool:
        """An unbounded asyncio pool of one server (a cluster has none: its client keeps one per
        node, ``client``)."""
        if self.cluster is not None:
            raise SettingsError("CARMY_REDIS_CLUSTER_NODES is set: a Redis Cluster has no single connection pool")
        target = self.sentinel
        if target is None:
            return packed_by_hiredis(Pool.from_url(self.url, **options))
        return packed_by_hiredis(SentinelManagedPool(target.service, _manager(target), **_node(target, options)))

    def client(self, **options: Any) -> Redis:
        """An asyncio client with as many connections as its callers use (workers, pub/sub
        listeners): on its own unbounded pool, closed with the client; on a cluster, a
        ``StoreCluster`` of ``UNBOUNDED`` commands at once."""
        if self.cluster is not None:
            return as_redis(self.cluster_client(max_connections=UNBOUNDED, **options))
        return Redis.from_pool(self.pool(**options))

    def store_client(self, *, max_connections: int, wait: float, **options: Any) -> Redis:
        """An asyncio client on a ``StorePool`` of ``max_connections``, where a caller waits up to
        ``wait`` seconds for a free connection while Redis is reachable; on a cluster, a
        ``StoreCluster`` with the same bound and wait."""
        if self.cluster is not None:
            return as_redis(self.cluster_client(max_connections=max_connections, wait=wait, **options))
        target = self.sentinel
        if target is None:
            pool: ConnectionPool = StorePool.from_url(self.url, max_connections=max_connections, timeout=wait,
                                                      **options)
        else:
            pool = SentinelPool(target.service, _manager(target), max_connections=max_connections, timeout=wait,
                                **_node(target, options))
        return Redis.from_pool(packed_by_hiredis(pool))

    def sync_client(self, **options: Any) -> redis.Redis:
        """A synchronous client (the heartbeat thread, the health check), which connects on
        first use; on a cluster, a synchronous cluster client made on its first command
        (``store.cluster.LazySyncCluster``)."""
        if self.cluster is not None:  # the same commands, routed by key
            return cast(redis.Redis, LazySyncCluster(self.cluster, **options))
        target = self.sentinel
        if target is None:
            return redis.Redis.from_url(self.url, **options)
        manager = redis.sentinel.Sentinel(target.sentinels, sentinel_kwargs=_sentinel_kwargs(target))
        pool = redis.sentinel.SentinelConnectionPool(target.service, manager, **_node(target, options))
        return redis.Redis.from_pool(pool)


def _manager(target: SentinelTarget) -> Sentinel:
    return Sentinel(target.sentinels, sentinel_kwargs=_sentinel_kwargs(target))


def _sentinel_kwargs(target: SentinelTarget) -> dict[str, Any]:
    return {**SENTINEL_TIMEOUTS, "password": target.sentinel_password}


def _node(target: SentinelTarget, options: dict[str, Any]) -> dict[str, Any]:
    """Options of the connections to the data servers."""
    return {"db": target.db, "username": target.username, "password": target.password, **options}
