"""The audit trail and the tool locks over four partitions on a real Redis Cluster (three
primaries): every call stays in one slot (a cluster refuses anything else), the sink's reads go
one per partition, pages merge the primaries' streams, and a tool's lock in its own slot still
lets one attempt at a time begin."""

from __future__ import annotations

import asyncio

import pytest

from carmy_worker.runtime.lock import ToolLock
from carmy_worker.store import keys, records
from carmy_worker.store.audit import AuditTrail
from carmy_worker.store.cluster import StoreCluster
from carmy_worker.store.locks import ToolLocks
from carmy_worker.store.shipment import GROUP, Shipment


@pytest.fixture(autouse=True)
async def emptied(cluster: StoreCluster, four_partitions: int) -> None:
    """Every key named over four partitions, and the four audit streams and the lock empty."""
    for partition in keys.partitions():
        await cluster.delete(keys.audit(partition))
    await cluster.delete(keys.lock("tally"))


async def test_the_trail_of_four_partitions_is_written_paged_and_shipped_on_a_cluster(cluster: StoreCluster) -> None:
    shipment = Shipment(cluster, "one")
    await shipment.join()
    trail = AuditTrail(cluster)
    written = []
    for i in range(40):
        exec_id = keys.new_execution_id(i % 4)
        await trail.replayed(exec_id, records.completed(exec_id, "echo", b"{}", cacheable=False, duration_ms=1),
                             via="http")
        written.append(exec_id)
    seen, cursor = [], None
    while True:
        page = await trail.page(limit=7, cursor=cursor)
        seen += [entry.execution_id for entry in page.entries]
        if page.cursor is None:
            break
        cursor = page.cursor
    assert sorted(seen) == sorted(written) and len(set(seen)) == 40
    shipped: list[str] = []
    while len(shipped) < 40:
        lot = await shipment.read(100, block_ms=100)
        assert lot.ids, "entries left unshipped"
        shipped += [entry.execution_id for entry in lot.entries]
        await shipment.ack(lot.ids)
    assert sorted(shipped) == sorted(written)
    for partition in keys.partitions():
        assert (await cluster.xpending(keys.audit(partition), GROUP))["pending"] == 0
    assert await trail.trim(max_entries=1000, retention_s=3600) == 0
    assert await trail.length() == 40


async def test_one_attempt_at_a_time_takes_a_tools_lock_on_a_cluster(cluster: StoreCluster) -> None:
    executions = [keys.new_execution_id(i % 4) for i in range(8)]
    for exec_id in executions:
        await cluster.hset(keys.execution(exec_id), mapping={"attempt": 1, "state": "running", "worker": "w"})
    locks, never = ToolLocks(cluster, worker_id="w"), asyncio.Event()
    inside, most = 0, 0

    async def run(exec_id: str) -> None:
        nonlocal inside, most
        lock = ToolLock(locks, "tally", exec_id, 1)
        assert await lock.acquire(20, never) == "taken"
        inside += 1
        most = max(most, inside)
        await cluster.get(keys.lock("tally"))  # a round trip while the others keep trying
        inside -= 1
        await lock.release()

    await asyncio.gather(*(run(exec_id) for exec_id in executions))
    assert most == 1
    assert [await cluster.hget(keys.execution(x), "began") for x in executions] == [b"1"] * 8
