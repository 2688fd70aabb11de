"""Which faults a run may play: the single Redis's restarts, a Sentinel group's failover, or a
Redis Cluster's failover and slot migration."""

from __future__ import annotations

from itertools import islice

from redis.crc import key_slot

from carmy_worker.store import keys
from chaos.faults import default_kinds, partition_slot, refusal, schedule
from chaos.model import FAULT_KINDS


def test_the_default_faults_follow_the_redis_of_the_run() -> None:
    single, sentinel, cluster = default_kinds("single"), default_kinds("sentinel"), default_kinds("cluster")
    assert "redis-failover" not in single and {"redis-term", "redis-kill"} <= set(single)
    assert "redis-failover" in sentinel and not {"redis-term", "redis-kill"} & set(sentinel)
    assert {"cluster-failover", "slot-migrate"} <= set(cluster)
    assert not {"redis-term", "redis-kill", "redis-failover"} & set(cluster)
    assert not {"cluster-failover", "slot-migrate"} & (set(single) | set(sentinel))
    assert set(single) | set(sentinel) | set(cluster) == set(FAULT_KINDS) - {"deploy"}
    assert {"worker-kill", "redis-full", "overload"} <= set(single) & set(sentinel) & set(cluster)
    assert "deploy" not in set(single) | set(sentinel) | set(cluster)  # opt-in: played when named
    assert all(refusal(["deploy", "worker-kill"], redis) is None for redis in ("single", "sentinel", "cluster"))


def test_faults_the_redis_cannot_take_are_refused_with_the_way_out() -> None:
    assert refusal(["redis-failover", "worker-kill"], "sentinel") is None
    assert refusal(["redis-kill", "overload"], "single") is None
    assert refusal(["cluster-failover", "slot-migrate", "redis-full"], "cluster") is None
    assert refusal([], "sentinel") is None
    assert "--sentinel" in (refusal(["redis-failover"], "single") or "")
    assert "redis-failover" in (refusal(["redis-kill"], "sentinel") or "")
    assert "cluster-failover" in (refusal(["redis-kill"], "cluster") or "")
    assert "--cluster" in (refusal(["slot-migrate"], "sentinel") or "")
    assert refusal(["redis-nap"], "sentinel") == "unknown faults: redis-nap"


def test_every_kind_comes_once_before_any_comes_again() -> None:
    kinds = default_kinds("cluster")
    first = [kind for kind, _ in islice(schedule(kinds, seed=1), len(kinds))]
    assert sorted(first) == sorted(kinds)


def test_a_partitions_slot_is_the_slot_of_every_key_it_names() -> None:
    record = keys.record(keys.new_execution_id(0))
    assert partition_slot(0) == key_slot(keys.pending(0).encode()) == key_slot(record.encode())
