"""A worker's wait over four partitions on a real Redis Cluster (three primaries): each partition's
``BLPOP`` is held on a connection to its queue's primary, and once one returns, the others are
ended with ``CLIENT UNBLOCK`` sent to the primary that holds each (a client id is a node's own):
a job in one partition ends the whole round at once, not at the others' timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from bench.localcluster import LocalCluster
from carmy_worker.store import jobs, keys
from carmy_worker.store.cluster import StoreCluster, as_redis
from carmy_worker.store.leases import Leases
from carmy_worker.store.submit import Submit
from carmy_worker.store.wakeups import wait_on_every_partition
from carmy_worker.wire import ExecutionJob
from tests.cluster.conftest import cluster_client
from tests.support import wait_until_async

GROUP = "g-wakeups"
WAIT_S = 30.0  # each partition's wait: far longer than the round may take


@pytest.fixture
async def cluster(redis_cluster: LocalCluster, four_partitions: int) -> AsyncIterator[StoreCluster]:
    """A client of the cluster (with no read timeout: a BLPOP waits WAIT_S) and GROUP's four queues empty."""
    client = cluster_client(redis_cluster, max_connections=64, socket_timeout=None)
    await client.initialize()
    queues = [jobs.queue_name(GROUP, p) for p in keys.partitions()]
    for queue in queues:
        await client.delete(queue, jobs.wake_list(queue))
    yield client
    await client.aclose()


async def test_a_job_in_one_partition_ends_the_round_on_every_primary_at_once(
        cluster: StoreCluster, redis_cluster: LocalCluster) -> None:
    queues = [jobs.queue_name(GROUP, p) for p in keys.partitions()]
    primaries = {redis_cluster.owner(cluster.keyslot(queue)).port for queue in queues}
    assert len(primaries) > 1  # the waits are held on several nodes
    redis = as_redis(cluster)
    leases = Leases(redis, "w-wakeups")
    started = time.monotonic()
    round_ = asyncio.create_task(wait_on_every_partition(leases, redis, queues, timeout=WAIT_S, free=4,
                                                         lease_ms=60_000, look_ahead=10))

    def blocked() -> int:
        return sum(int(str(server.info("clients")["blocked_clients"])) for server in redis_cluster.primaries())
    await wait_until_async(lambda: blocked() == len(queues), timeout=10, what="a BLPOP blocked in every partition")
    assert not round_.done()
    exec_id = keys.new_execution_id(2)
    await Submit(redis, retention=600)(ExecutionJob(execution_id=exec_id, tool="t", arguments=b"{}"), group=GROUP,
                                       idempotent=True, workers_alive=True, max_pending=100, queue_wait_ms=60_000,
                                       admission_ms=60_000)
    async with asyncio.timeout(10):  # the other waits would hold the round for WAIT_S
        taken = await round_
    assert [lease.job_id for lease in taken] == [exec_id]
    # A free slot for each partition: every partition's LEASE may claim one, this one did.
    assert taken[0].claim is not None and taken[0].claim.verdict == "run"
    assert time.monotonic() - started < 10
    assert blocked() == 0  # none left blocked on any node
