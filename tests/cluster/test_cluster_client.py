"""The connector's cluster client against a real cluster: scripts run on the shard of their
keys, a burst larger than the connection bound waits its turn instead of failing, redirections
during a migration never reach the caller, and a dead primary's slots answer again once its
replica is promoted."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from typing import cast

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from bench.localcluster import LocalCluster
from carmy_worker.store import cluster as cluster_module
from carmy_worker.store.cluster import SLOTS_TIMEOUT_S, ClusterUnreachable, LazySyncCluster, StoreCluster
from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.fanout import reload_on_connections_of_its_own
from tests.cluster.conftest import cluster_client
from tests.support import new_tmp

INCR_BOTH = "redis.call('INCR', KEYS[1]); return redis.call('INCR', KEYS[2])"


@pytest.fixture
async def cluster(redis_cluster: LocalCluster) -> AsyncIterator[StoreCluster]:
    client = cluster_client(redis_cluster, max_connections=2)  # a burst below goes past this bound
    yield client
    await client.aclose()


async def test_a_script_runs_on_the_shard_of_its_keys_which_must_share_a_slot(cluster: StoreCluster,
                                                                            redis_cluster: LocalCluster) -> None:
    sha = await cluster.script_load(INCR_BOTH)  # on every primary (redis-py's routing of SCRIPT LOAD)
    for tag in ("a", "b", "c", "d"):
        assert await cluster.evalsha(sha, 2, f"{{{tag}}}x", f"{{{tag}}}y") == 1
    owners = {redis_cluster.owner(cluster.keyslot(f"{{{tag}}}x")).port for tag in ("a", "b", "c", "d")}
    assert len(owners) > 1  # the four tags are spread: each script ran where its slot lives
    with pytest.raises(RedisClusterException, match="same key slot"):
        await cluster.eval(INCR_BOTH, 2, "{a}x", "{b}x")


def test_the_synchronous_client_reaches_every_shard(redis_cluster: LocalCluster) -> None:
    connector = RedisConnector("redis://localhost/0", tuple(redis_cluster.nodes.split(",")))
    with connector.sync_cluster_client(socket_timeout=2) as client:
        client.mset_nonatomic({f"sync{i}": i for i in range(100)})
        assert client.mget_nonatomic([f"sync{i}" for i in range(100)]) == [str(i).encode() for i in range(100)]
        assert len({redis_cluster.owner(client.keyslot(f"sync{i}")).port for i in range(100)}) == 3


def test_threads_that_ask_a_lazy_client_at_once_share_the_one_it_makes(redis_cluster: LocalCluster,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The heartbeat thread and its node senders ask the lazy client (``LazySyncCluster``) for its
    first command at once: one client is made, not one per thread with the others' connections
    left open. The first making is held until a second one starts or half a second passes, so
    that a second thread asks while it is under way."""
    made: list[object] = []
    second = threading.Event()
    real = cluster_module.sync_cluster

    def making(*args: object, **options: object) -> object:
        made.append(None)
        if len(made) == 1:
            second.wait(0.5)  # a second making would set it at once; with the lock none comes
        else:
            second.set()
        return real(*args, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(cluster_module, "sync_cluster", making)
    connector = RedisConnector("redis://localhost/0", tuple(redis_cluster.nodes.split(",")))
    with cast(LazySyncCluster, connector.sync_client(socket_timeout=2)) as lazy:
        clients: list[object] = []
        asking = [threading.Thread(target=lambda: clients.append(lazy.client())) for _ in range(4)]
        for thread in asking:
            thread.start()
        for thread in asking:
            thread.join(timeout=30)
        assert len(made) == 1
        assert len(clients) == 4 and len({id(client) for client in clients}) == 1
        assert lazy.ping() is True


def test_a_reload_of_the_slot_table_leaves_the_connections_in_use_alone(redis_cluster: LocalCluster) -> None:
    """The heartbeat's node-sender threads read their nodes' connections while a reload of the
    slot table (after a node failed) runs in a thread of its own. redis-py's reload disconnects
    the pool of each seed it asks, connections in use included, and the seeds are the nodes the
    client sends to: a beat's call in flight on a node that answered failed with ``EBADF``."""
    connector = RedisConnector("redis://localhost/0", tuple(redis_cluster.nodes.split(",")))
    with connector.sync_cluster_client(socket_timeout=2) as client:
        client.ping(target_nodes=client.ALL_NODES)
        pools = [node.redis_connection.connection_pool for node in client.get_nodes()]
        in_use = [pool.get_connection() for pool in pools]  # as a sender thread holds one
        sockets = [conn._sock for conn in in_use]
        try:
            reload_on_connections_of_its_own(client)
            reload_on_connections_of_its_own(client)  # the seeds are the client's nodes after a load
            # Not closed under their reader (a closed one would connect again on the next send).
            assert [conn._sock for conn in in_use] == sockets and None not in sockets
            for conn in in_use:
                conn.send_command("PING")
                assert conn.read_response() == b"PONG"
            assert {n.name for n in client.get_nodes()} == {n.name for n in client.nodes_manager.startup_nodes.values()}
            assert client.get_node_from_key("{a}x").redis_connection.connection_pool in pools  # the nodes kept
        finally:
            for pool, conn in zip(pools, in_use, strict=True):
                pool.release(conn)


async def test_a_burst_past_the_connection_bound_waits_its_turn(cluster: StoreCluster) -> None:
    await cluster.delete("{burst}n")
    await asyncio.gather(*(cluster.incr("{burst}n") for _ in range(200)))
    assert await cluster.get("{burst}n") == b"200"
    node = cluster.get_node_from_key("{burst}n")
    assert len(node._connections) <= 2


async def test_a_pipeline_spans_shards_without_being_a_transaction(cluster: StoreCluster) -> None:
    pipe = cluster.pipeline()
    for tag in ("a", "b", "c"):
        pipe.set(f"{{{tag}}}p", tag)
    pipe.get("{a}p")
    assert await pipe.execute() == [True, True, True, b"a"]
    with pytest.raises(RedisClusterException, match="not a transaction"):
        cluster.pipeline(transaction=True)


@pytest.mark.slow
async def test_slots_migrating_under_load_never_reach_the_caller(cluster: StoreCluster,
                                                                 redis_cluster: LocalCluster) -> None:
    source, target = redis_cluster.primaries()[:2]
    await cluster.mset_nonatomic({f"load{i}": 0 for i in range(500)})
    moving = threading.Thread(target=redis_cluster.migrate_slots, args=(300, source, target))
    moving.start()
    done = 0
    while moving.is_alive() or done < 500:
        await asyncio.gather(*(cluster.incr(f"load{(done + i) % 500}") for i in range(50)))
        done += 50
    moving.join()
    counts = await cluster.mget_nonatomic([f"load{i}" for i in range(500)])
    assert sum(int(c) for c in counts) == done


@pytest.mark.slow
async def test_a_dead_primary_s_keys_answer_again_once_its_replica_is_promoted(
        cluster: StoreCluster, redis_cluster: LocalCluster) -> None:
    victim = redis_cluster.primaries()[0]
    key = next(f"dead{i}" for i in range(10_000) if redis_cluster.owner(cluster.keyslot(f"dead{i}")) is victim)
    with victim.client() as direct:  # WAIT counts the replicas that have this connection's writes
        direct.set(key, "kept")
        assert direct.wait(1, 2000) == 1
    errors: list[BaseException] = []
    killing = asyncio.create_task(asyncio.to_thread(redis_cluster.kill_primary, 0))
    while not killing.done():
        try:
            await cluster.get(key)
        except (RedisConnectionError, RedisTimeoutError) as exc:  # the documented, retryable kinds
            errors.append(exc)
        await asyncio.sleep(0.05)
    await killing
    # On the promoted replica, which the client finds: its first call may still meet the dead
    # primary (one more connection error), then it reloads the slot table.
    for _ in range(5):
        with contextlib.suppress(RedisConnectionError):
            assert await cluster.get(key) == b"kept"
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the key's new primary was not found")
    assert errors  # the window was seen, as connection errors only
    await asyncio.to_thread(redis_cluster.restart, victim)


@pytest.fixture(scope="module")
def guarded_cluster() -> Iterator[LocalCluster]:
    """A cluster of the module's own whose every node requires a password."""
    workdir = new_tmp()
    guarded = LocalCluster(workdir, password="s3cret-pass")
    try:
        guarded.start()
        yield guarded
    finally:
        guarded.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def test_the_url_s_password_reaches_every_node(guarded_cluster: LocalCluster) -> None:
    nodes = tuple(guarded_cluster.nodes.split(","))
    assert guarded_cluster.url.startswith("redis://:s3cret-pass@")
    client = RedisConnector(guarded_cluster.url, nodes).cluster_client(max_connections=2)
    try:
        await client.mset_nonatomic({f"pw{i}": i for i in range(100)})  # on every primary
        assert len({guarded_cluster.owner(client.keyslot(f"pw{i}")).port for i in range(100)}) == 3
    finally:
        await client.aclose()
    anonymous = RedisConnector("redis://localhost/0", nodes).cluster_client(max_connections=2)
    try:
        # A ConnectionError, as an unreachable cluster is (redis-py's RedisClusterException is no RedisError).
        with pytest.raises(ClusterUnreachable, match="Authentication required"):
            await anonymous.get("pw1")
    finally:
        await anonymous.aclose()


async def test_a_hung_seed_holds_a_reload_of_the_slot_table_for_a_second_not_until_it_wakes(
        redis_cluster: LocalCluster) -> None:
    """The slot table is asked of the seeds in turn, on the client's own connection to each: on a
    client without a reply timeout (a worker's calls), a seed that hangs (stopped: it accepts the
    connection and answers nothing) held the reload, and every command behind it, until it woke.
    A replica here, so that the cluster does not fail it over meanwhile."""
    hung = redis_cluster.replicas()[0]
    others = [server.address for server in redis_cluster.live() if server is not hung]
    connector = RedisConnector("redis://localhost/0", (hung.address, *others))  # the hung seed asked first
    client = connector.cluster_client(max_connections=8, wait=10.0, socket_connect_timeout=1.0, socket_timeout=None)
    hung.pause()
    try:
        started = asyncio.get_running_loop().time()
        async with asyncio.timeout(15):  # the test's bound: it used to wait for the seed to wake
            await client.initialize()
        took = asyncio.get_running_loop().time() - started
    finally:
        hung.resume()
        await client.aclose()
    assert SLOTS_TIMEOUT_S - 0.05 <= took < SLOTS_TIMEOUT_S + 5
    assert client.primary_for("{c:0}").port != hung.port  # the table came from another seed


async def test_a_hung_primary_holds_no_command_for_another_when_the_slot_table_is_loaded(
        slow_to_fail_over: LocalCluster) -> None:
    """redis-py asked ``COMMAND`` (where each command's keys are) of the table's first primary at
    every load of the slot table, holding the load's lock: on a client without a reply timeout (a
    worker's), a first primary that hangs held every command of the client, those for the other
    primaries too, until it woke. A client asks it once, of the primaries in turn, each within
    ``SLOTS_TIMEOUT_S``. (A cluster of the test's own: the hung primary is not failed over.)"""
    cluster = slow_to_fail_over
    connector = RedisConnector("redis://localhost/0", tuple(cluster.nodes.split(",")))
    client = connector.cluster_client(max_connections=8, wait=10.0, socket_connect_timeout=1.0, socket_timeout=None)
    await client.initialize()
    first = client.nodes_manager.default_node  # the primary redis-py asks
    hung = cluster.server_on(first.port)
    key = next(k for k in (f"elsewhere{i}" for i in range(100)) if client.primary_for(k).port != hung.port)
    others = [server.address for server in cluster.live() if server is not hung]
    fresh = RedisConnector("redis://localhost/0", (hung.address, *others)).cluster_client(
        max_connections=8, wait=10.0, socket_connect_timeout=1.0, socket_timeout=None)
    loop = asyncio.get_running_loop()
    hung.pause()
    try:
        client.reload_slots()  # as after a failure: the next command loads the table again
        started = loop.time()
        async with asyncio.timeout(15):  # the test's bound: it used to wait for the node to wake
            await client.set(key, "reloaded")
        reloaded_in = loop.time() - started
        assert client.nodes_manager.default_node is first  # still the first primary: not asked
        started = loop.time()
        async with asyncio.timeout(15):
            await fresh.set(key, "loaded")  # its first table, the hung node the first seed
        loaded_in = loop.time() - started
    finally:
        hung.resume()
        await client.aclose()
        await fresh.aclose()
    assert reloaded_in < SLOTS_TIMEOUT_S + 3  # the hung node's CLUSTER SLOTS at most
    assert loaded_in < 2 * SLOTS_TIMEOUT_S + 3  # its CLUSTER SLOTS, then its COMMAND, at most
