"""The catalog's refresh timed in-process, for the ``cost_catalog`` curve: what each API process
does when a worker comes or goes (``api.calling.catalog``)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import msgspec
import redis.asyncio

from api.calling.catalog import Catalog
from carmy_worker.store.roster import Liveness, worker_infos
from carmy_worker.wire import msgpack_encoder, worker_info_decoder

DEAD_AFTER = 10.0


@dataclass(frozen=True)
class RefreshCost:
    wall_ms: float  # a new, empty catalog's refresh: every worker's info read, the view built
    cpu_ms: float  # the CPU of that refresh (this process's): what a loaded machine moves least
    # The CPU of a refresh of a catalog that knows the worker, after one more worker of the same
    # tools registered: what each API process pays as a group scales out, or a worker restarts.
    alike_cpu_ms: float


async def refresh_cost(url: str, times: int) -> RefreshCost:
    """Medians of ``times`` refreshes each, against the one worker registered at ``url``. The
    workers of the same tools it registers last (copies of its info under new ids, with no
    heartbeat after the first) are left for the caller to flush."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        wall, cpu = [], []
        for _ in range(times):
            catalog = Catalog(client, server_name="bench", dead_after=DEAD_AFTER, refresh_interval=60.0)
            started, cpu_started = time.perf_counter(), time.process_time()
            await catalog.refresh()
            wall.append((time.perf_counter() - started) * 1000)
            cpu.append((time.process_time() - cpu_started) * 1000)
        alike = [await _one_more_alike(client, catalog, i) for i in range(times)]
    finally:
        await client.aclose()
    return RefreshCost(statistics.median(wall), statistics.median(cpu), statistics.median(alike))


async def _one_more_alike(client: redis.asyncio.Redis, catalog: Catalog, n: int) -> float:
    """ms of CPU of ``catalog``'s refresh once a copy of its first worker, under a new id, is registered."""
    first = catalog.view.workers[-1][0].worker_id  # the oldest: the worker that really runs
    info = worker_info_decoder.decode((await worker_infos(client, [first]))[first])
    copy = msgspec.structs.replace(info, worker_id=f"{first}-alike-{n}", started_ms=info.started_ms + n + 1)
    liveness = Liveness(client, dead_after=DEAD_AFTER)
    await liveness.register(copy.worker_id, msgpack_encoder.encode(copy))
    await liveness.heartbeat(copy.worker_id)
    started = time.process_time()
    await catalog.refresh()
    return (time.process_time() - started) * 1000
