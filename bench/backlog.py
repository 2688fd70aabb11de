"""Work waiting in Redis (issue 35's queued work): executions queued where no worker takes them,
and jobs due an hour ahead. At each length, Redis's memory per item and the time of one more
SUBMIT, LEASE or CREATE: none of them may grow with the queue's length.

The executions are queued with the store's own ``Submit`` (the script ``POST /agent/execute``
runs), in-process, on a queue of their own: a worker would start them. Each timed call is sent
alone and waited for (a round trip on loopback included), the median of ``calls``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.asyncio import Redis

from bench import jobs as bench_jobs
from carmy_worker.store import jobs, keys
from carmy_worker.store.jobstore import JobStore
from carmy_worker.store.leases import Leases
from carmy_worker.store.submit import Submit
from carmy_worker.wire import ExecutionJob

GROUP = "bench-backlog"
QUEUE = jobs.queue_name(GROUP, 0)  # every execution drawn into partition 0: one queue to lease from
FILLERS = 32  # SUBMITs in flight while filling


@dataclass(frozen=True)
class Waiting:
    items: int
    bytes_per_item: float  # used_memory growth over the items, from an empty Redis
    submit_us: float  # one SUBMIT more, median
    lease_us: float  # one LEASE of the queue's head (claimed by a worker id that never runs it), median


def new_job() -> ExecutionJob:
    return ExecutionJob(execution_id=keys.new_execution_id(0), tool="noop", arguments=b"{}")


async def submit(store: Submit) -> None:
    done = await store(new_job(), group=GROUP, idempotent=True, workers_alive=True, max_pending=10**9,
                       queue_wait_ms=3_600_000, admission_ms=3_600_000)
    if done.kind != "new":
        raise RuntimeError(f"SUBMIT refused an execution: {done.kind}")


async def fill(store: Submit, count: int) -> None:
    remaining = [count]

    async def loop() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            await submit(store)

    await asyncio.gather(*(loop() for _ in range(FILLERS)))


async def median_us(step: Callable[[], Awaitable[object]], calls: int) -> float:
    """The median µs of ``calls`` awaits of ``step()``, one after another."""
    took = []
    for _ in range(calls):
        started = time.perf_counter()
        await step()
        took.append((time.perf_counter() - started) * 1e6)
    return sorted(took)[len(took) // 2]


async def waiting_curve(url: str, sizes: tuple[int, ...], calls: int) -> list[Waiting]:
    """Fill one queue to each of ``sizes`` in turn (Redis flushed before), measuring at each."""
    client = Redis.from_url(url, max_connections=FILLERS + 4)
    store = Submit(client, retention=86400)
    leases = Leases(client, "bench-backlog-worker")
    measured, queued = [], 0
    try:
        await client.flushall()
        before = await used_memory(client)
        for size in sizes:
            await fill(store, size - queued)
            queued = size
            used = await used_memory(client) - before
            submit_us = await median_us(lambda: submit(store), calls)
            lease_us = await median_us(lambda: leases.take(QUEUE, most=1, lease_ms=3_600_000, look_ahead=16), calls)
            queued += calls  # the SUBMITs added as many as the LEASEs took off the queue's head
            measured.append(Waiting(size, used / size, submit_us, lease_us))
    finally:
        await client.aclose()
    return measured


@dataclass(frozen=True)
class Queued:
    jobs: int
    bytes_per_job: float
    create_us: float  # one CREATE more, median


async def used_memory(client: Redis) -> int:
    return int((await client.info("memory"))["used_memory"])


async def queued_curve(url: str, sizes: tuple[int, ...], calls: int) -> list[Queued]:
    """Jobs due an hour ahead, made up to each of ``sizes`` (``bench.jobs.create_queued``), with
    the memory per job and the time of one CREATE more at each."""
    client = Redis.from_url(url)
    store = JobStore(client)
    fields = bench_jobs.anonymous_job_fields(bench_jobs.MEMORY_TOOL, b'{"city":"Lisbon"}')
    measured, made = [], 0
    try:
        await client.flushall()
        before = await used_memory(client)

        async def create() -> None:
            await store.create(job_id=store.new_job_id(keys.owner(None)), tool=bench_jobs.MEMORY_TOOL,
                               owner=keys.owner(None), fields=fields, idempotency=None, fingerprint="", run_at_ms=None,
                               delay_ms=bench_jobs.HOUR_MS, horizon_ms=2 * bench_jobs.HOUR_MS, max_open=0)

        for size in sizes:
            await bench_jobs.create_queued(url, bench_jobs.MEMORY_TOOL, size - made)
            made = size
            used = await used_memory(client) - before
            create_us = await median_us(create, calls)
            made += calls
            measured.append(Queued(size, used / size, create_us))
    finally:
        await client.aclose()
    return measured
