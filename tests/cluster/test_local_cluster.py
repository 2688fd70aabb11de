"""The local cluster the cluster tests stand on: every slot served, a primary killed is replaced
by its replica without losing what it had replicated, and slots move while a client writes."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from redis.cluster import ClusterNode, RedisCluster

from bench.localcluster import SLOTS, LocalCluster


@pytest.fixture
def client(redis_cluster: LocalCluster) -> Iterator[RedisCluster]:
    nodes = [ClusterNode("127.0.0.1", server.port) for server in redis_cluster]
    with RedisCluster(startup_nodes=nodes, socket_timeout=2, cluster_error_retry_attempts=10) as c:
        yield c


def test_three_primaries_serve_every_slot_and_each_has_a_replica(redis_cluster: LocalCluster,
                                                                  client: RedisCluster) -> None:
    primaries, replicas = redis_cluster.primaries(), redis_cluster.replicas()
    assert len(primaries) == 3 and len(replicas) == 3
    assert sum(redis_cluster.slots_of(p) for p in primaries) == SLOTS
    assert redis_cluster.nodes.count(",") == 5
    # Keys land on every primary (the slots spread over them), and read back.
    client.mset_nonatomic({f"k{i}": i for i in range(300)})
    assert all(p.client().dbsize() > 0 for p in primaries)
    assert client.get("k299") == b"299"


@pytest.mark.slow
def test_a_killed_primary_is_replaced_by_its_replica(redis_cluster: LocalCluster, client: RedisCluster) -> None:
    victim = redis_cluster.primaries()[0]
    key = next(f"kept-{i}" for i in range(10_000) if client.get_node_from_key(f"kept-{i}").port == victim.port)
    with victim.client() as direct:  # WAIT counts the replicas that have this connection's writes
        direct.set(key, "yes")
        assert direct.wait(1, 2000) == 1  # replicated before the kill, so the failover keeps it

    killed = redis_cluster.kill_primary(0)
    assert killed is victim and not victim.proc.alive()
    assert victim not in redis_cluster.primaries() and len(redis_cluster.primaries()) == 3
    assert client.get(key) == b"yes"  # MOVED to the promoted replica, followed by the client

    redis_cluster.restart(victim)
    assert victim in redis_cluster.replicas()


@pytest.mark.slow
def test_slots_move_while_a_client_writes(redis_cluster: LocalCluster, client: RedisCluster) -> None:
    source, target = redis_cluster.primaries()[:2]
    before = redis_cluster.slots_of(source), redis_cluster.slots_of(target)
    client.mset_nonatomic({f"m{i}": i for i in range(2000)})  # keys for the migration to carry
    written: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            try:
                client.set(f"w{i}", i)
                written.append(i)
            except Exception as exc:  # every failure is the finding
                errors.append(exc)
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        redis_cluster.migrate_slots(500, source, target)
    finally:
        stop.set()
        writer.join(30)
    assert redis_cluster.slots_of(source) == before[0] - 500
    assert redis_cluster.slots_of(target) == before[1] + 500
    assert errors == []
    assert len(written) > 100
    assert client.mget_nonatomic([f"w{i}" for i in written]) == [str(i).encode() for i in written]
    assert client.mget_nonatomic([f"m{i}" for i in range(2000)]) == [str(i).encode() for i in range(2000)]


@pytest.mark.slow
def test_a_slot_one_primary_dropped_from_its_own_table_is_claimed_again(redis_cluster: LocalCluster) -> None:
    """What Redis 7.0.15 once left behind as an old primary came back (``LocalCluster.restart``):
    a promoted replica that no longer served one of its slots in its own table, while the other
    nodes still said it did, and said ``cluster_state:fail`` for good. The restart mends it, and
    the cluster is whole again for the next test."""
    owner = redis_cluster.primaries()[1]
    slot = next(s for s in range(SLOTS) if redis_cluster.owner(s) is owner)
    with owner.check_client() as client:
        client.execute_command("CLUSTER", "DELSLOTS", slot)
    assert redis_cluster.problem() is not None
    assert redis_cluster.give_back_unserved() == [slot]
    redis_cluster.wait_ok(30)
    assert redis_cluster.owner(slot) is owner
