"""The no-op rows on a Redis Cluster, beside one Redis, in one run (issue 34).

The workload is the ``carmy`` scenario's 64-client row: ``noop`` over HTTP, 1 API + 2 workers,
64 wrk clients. It is measured first on the run's single Redis (the ratio's baseline, measured
here rather than taken from ``carmy``'s row, so that both sides run back to back on the same
processes' settings), then on a ``LocalCluster`` (three primaries, three replicas, no
persistence, like the run's Redis) with each partition count of ``PARTITIONS``: 1, every key
in one slot and so on one primary (the honest baseline: a cluster that spreads nothing), and
16, a cluster's default (``CARMY_REDIS_PARTITIONS``), whose slots fall on every primary.

Each cluster row says what share of the primaries' Redis CPU each primary used while measured
(``INFO cpu`` before and after): the partitions spread the work when no primary does most of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench import wrk
from bench.localcluster import LocalCluster
from bench.processes import wait_until
from bench.procs import CpuMeter, Processes
from bench.report import ClusterPoint, Row
from bench.sizes import call
from carmy_worker.store import keys

if TYPE_CHECKING:
    from bench.scenarios import Bench

# The partition counts measured on the cluster: none spread, and a cluster's default.
PARTITIONS = (1, 16)
# The carmy scenario's 64-client row: its clients, workers and their concurrency.
CLIENTS = 64
WORKERS = 2
WORKER_CONCURRENCY = 16
NOOP = call("noop", {})
SETTLE_TIMEOUT = 30.0


def cluster_noop(b: Bench) -> None:
    """The 64-client no-op row on one Redis, then on a Redis Cluster with each of ``PARTITIONS``."""
    with b.processes("cluster_single") as procs:
        for _ in range(WORKERS):
            procs.carmy_worker(env={"CARMY_CONCURRENCY": str(WORKER_CONCURRENCY)})
        _, base = procs.carmy_api()
        b.report.cluster_single = b.load("cluster_single_64", "Carmy, no-op over HTTP, one Redis (1 API + 2 workers)",
                                         base, NOOP, CLIENTS, procs)
    b.redis.flush()
    local = LocalCluster(b.workdir / "cluster")
    local.start()
    try:
        for partitions in PARTITIONS:
            flush(local)  # the partition count is recorded in Redis: a new count needs a fresh store
            b.report.cluster.append(measure(b, local, partitions))
    finally:
        local.stop()


def measure(b: Bench, local: LocalCluster, partitions: int) -> ClusterPoint:
    """1 API + 2 workers on ``local`` with ``partitions``, the no-op at 64 clients."""
    env = {"CARMY_REDIS_CLUSTER_NODES": local.nodes, "CARMY_REDIS_PARTITIONS": str(partitions)}
    procs = Processes(b.workdir, local.url, f"cluster_p{partitions}")
    b.started.append(procs)  # its log errors go in the report with everyone's
    with procs:
        for _ in range(WORKERS):
            procs.carmy_worker(env={"CARMY_CONCURRENCY": str(WORKER_CONCURRENCY), **env})
        _, base = procs.carmy_api(env=env)
        if b.config.warmup:
            wrk.run(base, NOOP, clients=CLIENTS, seconds=b.config.warmup, workdir=b.workdir)
            settle(local, partitions)  # as Bench.load: the warm-up's cancelled calls out of the way
        primaries = local.primaries()
        before = local.primary_cpu()
        with CpuMeter([*procs.procs, *(server.proc for server in primaries)]) as cpu:
            result = wrk.run(base, NOOP, clients=CLIENTS, seconds=b.config.seconds, workdir=b.workdir)
        used = {port: seconds - before.get(port, 0.0) for port, seconds in local.primary_cpu().items()}
    label = f"Carmy, no-op over HTTP, Redis Cluster, {partitions} partition{'s' if partitions > 1 else ''}"
    per_call = {kind: s / result.requests * 1e6 for kind, s in cpu.seconds.items()} if result.requests else {}
    row = Row(f"cluster_p{partitions}_64", label + " (1 API + 2 workers)", CLIENTS, result.p50_ms, result.p99_ms,
              result.rps, result.errors, cpu.summary, per_call)
    b.report.rows.append(row)
    if result.errors or not result.requests:
        b.report.problems.append(f"{label}: {result.requests} answers, {result.errors} errors; first unexpected "
                                 f"answer: {result.sample!r}")
    total = sum(used.values())
    shares = {port: s / total for port, s in used.items()} if total > 0 else {}
    return ClusterPoint(partitions, row, shares, total, result.requests)


def settle(local: LocalCluster, partitions: int) -> None:
    """Until no partition has an execution pending (Carmy's admission sets, on the cluster)."""
    mine = keys.partition_count()
    keys.use_partitions(partitions)  # named as the cluster's processes name them
    try:
        names = [keys.pending(n) for n in keys.partitions()]
    finally:
        keys.use_partitions(mine)
    with local.client() as cluster:
        wait_until(lambda: not any(cluster.zcard(name) for name in names), SETTLE_TIMEOUT,
                   "every partition's pending set empty", interval=0.01)


def flush(local: LocalCluster) -> None:
    """Forget every key on every primary (the replicas follow)."""
    for server in local.primaries():
        with server.check_client() as node:
            node.flushall()
