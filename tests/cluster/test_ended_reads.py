"""``Reads.ended`` (the recheck's one read, ``api/events/recheck.py``) on a real cluster: with
the executions of sixteen partitions spread over its three primaries, read in chunks of one
partition's, it finds exactly those that ended and those Redis lost."""

from __future__ import annotations

from bench.localcluster import LocalCluster
from carmy_worker.store import keys
from carmy_worker.store.cluster import StoreCluster
from carmy_worker.store.reads import Reads, chunks
from tests.cells import partitions

PARTITIONS = 16


async def test_ended_reads_every_partition_on_its_own_node(cluster: StoreCluster, redis_cluster: LocalCluster) -> None:
    with partitions(PARTITIONS):
        ids = [keys.new_execution_id(i % PARTITIONS) for i in range(200)]
        assert len({redis_cluster.owner(cluster.keyslot(keys.execution(e))).port for e in ids}) == 3
        for i, exec_id in enumerate(ids):
            if i % 7 != 3:  # every seventh one Redis lost: no hash at all
                await cluster.hset(keys.execution(exec_id), "state", "done" if i % 5 == 0 else "running")
        try:
            ended = [e for some in chunks(ids, 4) for e in await Reads(cluster).ended(some)]
            assert sorted(ended) == sorted(e for i, e in enumerate(ids) if i % 7 == 3 or i % 5 == 0)
        finally:
            for exec_id in ids:
                await cluster.delete(keys.execution(exec_id))
