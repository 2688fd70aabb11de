"""The store's ways of sending a script on a real cluster: a batch writes each call to the
primary of its slot (a line per node), a call sent with a follow-up in another slot (a worker's
SETTLE with the LEASE of its next job, in another partition) has each go to its own slot's
primary, a call a node refuses because its slot moved is sent again where the slot is and runs
once, and a durable call's ``WAIT`` goes to the node that ran the script (its replicas are the
ones that count)."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from bench.localcluster import LocalCluster
from carmy_worker.store.batch import Batch, FollowUp
from carmy_worker.store.cluster import StoreCluster, as_redis
from carmy_worker.store.durable import Durability
from carmy_worker.store.scripts import Script, bind, run
from tests.cluster.conftest import flush

COUNT = Script("TEST_CLUSTER_COUNT", "return redis.call('INCR', KEYS[1])")


@pytest.fixture(autouse=True)
async def emptied(cluster: StoreCluster, redis_cluster: LocalCluster) -> None:
    """The client knows the slots' owners, and every primary is empty."""
    await cluster.initialize()
    flush(redis_cluster)


def waits_on(redis_cluster: LocalCluster) -> dict[int, int]:
    """How many WAITs each primary has run (``INFO commandstats``), by port."""
    counts = {}
    for server in redis_cluster.primaries():
        stats = server.info("commandstats").get("cmdstat_wait", {})
        counts[server.port] = int(cast(dict[str, int], stats).get("calls", 0))
    return counts


async def test_a_batch_writes_each_call_to_its_slots_primary(cluster: StoreCluster,
                                                             redis_cluster: LocalCluster) -> None:
    batch = Batch(as_redis(cluster))
    names = [f"{{t{i}}}n" for i in range(30)]
    replies = await asyncio.gather(*(batch.call(COUNT, [name], []) for name in names))  # one turn
    assert replies == [1] * 30  # each ran once
    owners = {redis_cluster.owner(cluster.keyslot(name)).address for name in names}
    assert set(batch._nodes) == owners and len(owners) == 3  # a line per node, none elsewhere
    assert await asyncio.gather(*(batch.call(COUNT, [name], []) for name in names)) == [2] * 30


class _Count(FollowUp):
    """A COUNT of ``key`` to follow another call; what it answered, once it has."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.got: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def make(self) -> tuple[Script, list[str], list[str]]:
        return COUNT, [self.key], []

    def answered(self, reply: asyncio.Future[int]) -> None:
        if not self.got.done():
            self.got.set_result(reply.result())


async def test_a_follow_up_in_another_slot_goes_to_its_own_primary(cluster: StoreCluster,
                                                                   redis_cluster: LocalCluster) -> None:
    first, then_key = "{c:0}n", "{c:1}n"  # two partitions' slots, on two primaries
    owner, other = (redis_cluster.owner(cluster.keyslot(k)) for k in (first, then_key))
    assert owner.port != other.port
    runs = bind(as_redis(cluster), COUNT, batch=Batch(as_redis(cluster), eager=True))
    for n in (1, 2):  # a cluster refuses a script whose key is in another node's slot: each ran where it is
        then = _Count(then_key)
        assert await runs.send([first], [], then) == n
        assert await asyncio.wait_for(then.got, 5) == n
        assert then.reply is not None and await then.reply == n
    with owner.check_client() as node:
        assert node.get(first) == b"2"
    with other.check_client() as node:
        assert node.get(then_key) == b"2"


async def test_a_batched_call_whose_slot_moved_runs_once_where_the_slot_is(cluster: StoreCluster,
                                                                           redis_cluster: LocalCluster) -> None:
    batch = Batch(as_redis(cluster))
    key = "{moving}n"
    assert await batch.call(COUNT, [key], []) == 1  # the batch now has a line to the slot's primary
    slot = cluster.keyslot(key)
    source = redis_cluster.owner(slot)
    target = next(p for p in redis_cluster.primaries() if p is not source)
    await asyncio.to_thread(redis_cluster.move_slot, slot, target)
    # Written to the old primary, which answers MOVED without running it; sent again, it runs there.
    assert await batch.call(COUNT, [key], []) == 2
    with target.check_client() as node:
        assert node.get(key) == b"2"


async def test_a_durable_call_waits_on_the_node_that_ran_it(cluster: StoreCluster,
                                                            redis_cluster: LocalCluster) -> None:
    durability = Durability(replicas=1, timeout_ms=2000)
    key = "{durable}n"
    owner = redis_cluster.owner(cluster.keyslot(key)).port
    before = waits_on(redis_cluster)
    assert await run(as_redis(cluster), COUNT, [key], [], durability) == 1
    after = waits_on(redis_cluster)
    assert {port: after[port] - before[port] for port in after} == {
        port: int(port == owner) for port in after}
    assert not durability._short  # its own replica acknowledged


async def test_a_durable_call_whose_slot_moved_runs_once_and_waits_where_it_ran(
        cluster: StoreCluster, redis_cluster: LocalCluster) -> None:
    durability = Durability(replicas=1, timeout_ms=2000)
    key = "{durable-moving}n"
    assert await run(as_redis(cluster), COUNT, [key], [], durability) == 1
    slot = cluster.keyslot(key)
    target = next(p for p in redis_cluster.primaries() if p is not redis_cluster.owner(slot))
    await asyncio.to_thread(redis_cluster.move_slot, slot, target)
    before = waits_on(redis_cluster)
    assert await run(as_redis(cluster), COUNT, [key], [], durability) == 2
    after = waits_on(redis_cluster)
    assert after[target.port] > before[target.port]
