"""Operating endpoints: ``/health`` (the process lives), ``/ready`` (it can serve: Redis
answers, has memory left for new work, and a worker is alive; and, told but not required, the
webhooks whose tool no worker serves) and ``/metrics`` (Prometheus text).

Execution counts and latency histograms come from Redis (``carmy_worker.store.metrics``), so they
cover every worker and are the same on every API replica; the ``carmy_api_*`` figures belong
to the process that was scraped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from api.calling.catalog import Catalog
from carmy_worker.sdk.errors import error, store_full, store_unavailable
from carmy_worker.store import metrics, version
from carmy_worker.store.memory import MemoryReading, StoreMemory
from carmy_worker.wire import ErrorBody

CHECK_TIMEOUT_S = 1.0


@dataclass
class ApiMetrics:
    """Figures of this API process."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.in_flight = Gauge("carmy_api_executions_in_flight", "Execute requests this process is answering",
                               registry=self.registry)
        self.sse_streams = Gauge("carmy_api_sse_streams_open", "SSE streams open on this process",
                                 registry=self.registry)
        self.responses = Counter("carmy_api_execute_responses", "Execute responses by HTTP status and outcome",
                                 ["status_code", "outcome"], registry=self.registry)
        # Each pair's child of ``responses``: labels() takes a lock and builds its key every call.
        self._responded: dict[tuple[int, str], Any] = {}

    def responded(self, status_code: int, outcome: str) -> None:
        """Count one execute response."""
        child = self._responded.get((status_code, outcome))
        if child is None:
            child = self._responded[status_code, outcome] = self.responses.labels(str(status_code), outcome)
        child.inc()


def _split(field_name: bytes) -> list[str]:
    return field_name.decode().split(metrics.SEP)


class ClusterCollector(Collector):
    """Renders one snapshot of the Redis-side figures."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        executions = CounterMetricFamily("carmy_executions", "Executions settled, by tool, status and error code",
                                         labels=["tool", "status", "code"])
        for name, value in s["executions"].items():
            executions.add_metric(_split(name), float(value))
        yield executions
        for hist, doc in (("run", "Time tools ran"), ("queue_wait", "Time executions waited for a worker")):
            yield self._histogram(f"carmy_execution_{hist}_seconds", doc, s[hist])
        yield GaugeMetricFamily("carmy_queue_depth", "Executions accepted and not yet started", value=s["queued"])
        yield GaugeMetricFamily("carmy_pending_executions", "Executions queued or running (admission)",
                                value=s["pending"])
        yield GaugeMetricFamily("carmy_workers_live", "Worker processes heartbeating and taking work",
                                value=s["workers"])
        jobs = CounterMetricFamily("carmy_jobs", "Jobs that reached a status, by tool (queued: created or retried by "
                                   "an operator; retried: queued again after a failed attempt; skipped: schedule "
                                   "occurrences missed past their grace)", labels=["tool", "status"])
        for name, value in s["jobs"].items():
            jobs.add_metric(_split(name), float(value))
        yield jobs
        yield GaugeMetricFamily("carmy_dead_letters", "Dead-lettered jobs kept for an operator",
                                value=s["dead_letters"])
        yield self._histogram("carmy_job_lateness_seconds", "How long after it was due each attempt of a job started",
                              s["job_lateness"])

    @staticmethod
    def _histogram(name: str, doc: str, raw: dict[bytes, bytes]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=["tool"])
        per_tool: dict[str, dict[str, int]] = {}
        for key, value in raw.items():
            tool, part = _split(key)
            per_tool.setdefault(tool, {})[part] = int(value)
        for tool, parts in sorted(per_tool.items()):
            cumulative, buckets = 0, []
            for i, edge in enumerate((*metrics.BUCKETS_MS, float("inf"))):
                cumulative += parts.get(str(i), 0)
                buckets.append(("+Inf" if edge == float("inf") else str(edge / 1000), float(cumulative)))
            family.add_metric([tool], buckets, sum_value=parts.get("sum", 0) / 1000)
        return family


class MemoryCollector(Collector):
    """Redis's memory as of this process's latest reading (``store.memory``), and the calls this
    process refused for it."""

    def __init__(self, memory: StoreMemory) -> None:
        self.memory = memory

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("carmy_api_store_full_refusals", "New calls this process refused with STORE_FULL "
                                  "(Redis out of memory for new work)", value=self.memory.refusals)
        reading = self.memory.reading
        if reading is None:
            return
        yield GaugeMetricFamily("carmy_redis_memory_used_bytes", "Memory Redis holds against its maxmemory",
                                value=reading.used)
        yield GaugeMetricFamily("carmy_redis_memory_limit_bytes", "Redis's maxmemory (0: none)", value=reading.limit)
        yield GaugeMetricFamily("carmy_redis_memory_admit_below_bytes", "New calls are admitted while Redis uses "
                                "less than this: maxmemory less CARMY_REDIS_MEMORY_HEADROOM", value=reading.admit_below)
        yield GaugeMetricFamily("carmy_redis_memory_full", "1 while new calls are refused because Redis is out of "
                                "memory for new work (STORE_FULL)", value=int(reading.full))


async def cluster_snapshot(redis: Redis, catalog: Catalog) -> dict[str, Any]:
    return {**await metrics.snapshot(redis), "workers": catalog.view.live_workers}


class Ops:
    def __init__(self, redis: Redis, catalog: Catalog, api_metrics: ApiMetrics, memory: StoreMemory) -> None:
        self.redis = redis
        self.catalog = catalog
        self.metrics = api_metrics
        self.memory = memory
        self._memory_registry = CollectorRegistry()
        self._memory_registry.register(MemoryCollector(memory))

    async def health(self, request: Request) -> Response:
        return JSONResponse({"ok": True}, headers={"cache-control": "no-store"})

    async def ready(self, request: Request) -> Response:
        checks: dict[str, Any] = {}
        reading: MemoryReading | None = None  # None: unknown, say with an ACL that denies INFO
        try:
            found, reading = await asyncio.wait_for(self.memory.read_with_version(), CHECK_TIMEOUT_S)
            if found is not None and version.too_old(found):  # every script would fail to compile
                checks["redis"] = {"ok": False, "error": _wire(store_unavailable(version.message(found)))}
            else:
                checks["redis"] = {"ok": True}
        except (RedisError, OSError, TimeoutError) as exc:
            checks["redis"] = {"ok": False, "error": _wire(store_unavailable(
                f"Redis does not answer: {type(exc).__name__}"))}
        if reading is not None and checks["redis"]["ok"]:
            checks["memory"] = _memory_check(reading)
        live = self.catalog.view.live_workers
        if checks["redis"]["ok"] and self.catalog.reachable and live:
            checks["workers"] = {"ok": True, "live": live}
        else:
            checks["workers"] = {"ok": False, "live": live, "error": _wire(error(
                "NO_WORKERS", "No worker is alive.", retry_after=2))}
        ready = all(c["ok"] for c in checks.values())
        if self.catalog.webhook_tools:  # told, not required: one webhook's tool missing leaves the rest servable
            unserved = self.catalog.view.unserved(self.catalog.webhook_tools)
            checks["webhooks"] = {"ok": not unserved, "required": False, "unserved": unserved}
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503,
                            headers={"cache-control": "no-store"})

    async def metrics_text(self, request: Request) -> Response:
        parts: list[bytes] = [generate_latest(self.metrics.registry), generate_latest(self._memory_registry)]
        try:
            snapshot = await asyncio.wait_for(cluster_snapshot(self.redis, self.catalog), CHECK_TIMEOUT_S)
        except (RedisError, OSError, TimeoutError):
            snapshot = None  # this process's own figures are still worth serving
        if snapshot is not None:
            registry = CollectorRegistry()
            registry.register(ClusterCollector(snapshot))
            parts.append(generate_latest(registry))
        return Response(b"".join(parts), media_type=CONTENT_TYPE_LATEST, headers={"cache-control": "no-store"})


def _memory_check(reading: MemoryReading) -> dict[str, Any]:
    check: dict[str, Any] = {"ok": not reading.full, "used_bytes": reading.used, "limit_bytes": reading.limit}
    if reading.limit:
        check["admit_below_bytes"] = reading.admit_below
    if reading.full:
        check["error"] = _wire(store_full())
    return check


def _wire(err: ErrorBody) -> dict[str, Any]:
    return msgspec.to_builtins(err)  # type: ignore[no-any-return]
