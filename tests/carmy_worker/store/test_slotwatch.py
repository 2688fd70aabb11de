"""``store.slotwatch``'s reading of ``CLUSTER SLOTS``: which primary serves a slot, named as the
cluster client names its nodes (the listener compares the two: ``store.shardpubsub``)."""

from __future__ import annotations

from redis.asyncio.cluster import ClusterNode

from carmy_worker.store.cluster import StoreCluster
from carmy_worker.store.slotwatch import parse


def test_each_slot_is_named_by_its_range_s_primary_and_a_slot_no_range_holds_by_none() -> None:
    client = StoreCluster(startup_nodes=[ClusterNode("127.0.0.1", 1)], max_connections=2,  # type: ignore[abstract]
                          wait=1.0)
    asked = ClusterNode("10.0.0.9", 7002)
    reply = [[9000, 16383, [b"10.0.0.3", 7003, b"id3"], [b"10.0.0.6", 7006, b"id6"]],
             [0, 5460, [b"10.0.0.1", 7001, b"id1"]],
             [5461, 8000, [b"", 7002, b"id2"]]]  # an empty host: the asked node's own
    table = parse(reply, client, asked)
    assert [table.owner(slot) for slot in (0, 5460, 5461, 8000, 8001, 8999, 9000, 16383)] == [
        "10.0.0.1:7001", "10.0.0.1:7001", "10.0.0.9:7002", "10.0.0.9:7002", None, None,
        "10.0.0.3:7003", "10.0.0.3:7003"]
