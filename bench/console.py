"""The console's pages at the size the issue names (issue 32): 10,000 audit entries, 100 workers
(serving 1,000 tools between them) and 1,000 jobs, each page loaded one after another by one
client, beside ``GET /health`` on the same process as the floor.

* The audit entries are written straight into the stream, field for field as the scripts write
  them (``store.lua``'s ``audit``), spread over the last hour: 10,000 real executions would only
  make the row slower to set up, not the pages' work different.
* The workers are registered and kept alive by heartbeats as real ones are (``store.roster``),
  ten groups of ten, each group serving 100 tools: the overview's sampler and the Tools page
  read every one of them.
* The jobs are made by ``JobStore.create``, the script ``POST /agent/jobs`` runs, due an hour
  ahead (a tenth of them dead letters would need a worker to run them; queued ones are what a
  busy console lists).

Each page is loaded ``loads`` times; the row reports the median and the slowest, in ms, and
whether every answer was a ``200`` with the page's marker in it.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass

import httpx
import redis

from carmy_worker.store import keys
from carmy_worker.store.roster import SyncLiveness
from carmy_worker.wire import ToolSpec, WorkerInfo, WorkerTool, msgpack_encoder

ENTRIES = 10_000
GROUPS = 10
WORKERS_PER_GROUP = 10
TOOLS_PER_GROUP = 100
STATUSES = ("completed",) * 8 + ("failed", "timed_out")
PRINCIPALS = ("alice", "bob", "carol", "dave")


@dataclass(frozen=True)
class PageTime:
    """One page's loads: its median and slowest time, ms; ``ok``: every load a 200 with its marker."""

    name: str
    path: str
    route: str  # the path as the routes name it
    p50_ms: float
    max_ms: float
    ok: bool


@dataclass(frozen=True)
class ConsoleResult:
    entries: int
    workers: int
    tools: int
    pages: list[PageTime]


def tool_name(group: int, i: int) -> str:
    return f"tool_{group:02d}_{i:03d}"


def spec(name: str) -> ToolSpec:
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
              "required": ["city"], "additionalProperties": False}
    return ToolSpec(name=name, description=f"{name}: a forecast for a city, for a few days.", input_schema=schema,
                    output_schema={"type": "object"}, effect="read", idempotent=True, parallel_safe=True,
                    confirmation="none")


def workers() -> list[WorkerInfo]:
    now = int(time.time() * 1000)
    made = []
    for g in range(GROUPS):
        tools = [WorkerTool(spec=spec(tool_name(g, i)), timeout=30.0) for i in range(TOOLS_PER_GROUP)]
        for w in range(WORKERS_PER_GROUP):
            made.append(WorkerInfo(worker_id=f"bench-w{g:02d}{w:02d}", started_ms=now, tools=tools,
                                   group=f"bench-group-{g:02d}", host=f"host-{g:02d}-{w:02d}", pid=1000 + w,
                                   concurrency=16))
    return made


class Heartbeats(threading.Thread):
    """Registers ``infos`` and heartbeats for each every 0.5 s until stopped, as live workers do."""

    def __init__(self, redis_url: str, infos: list[WorkerInfo]) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(redis_url)
        self.liveness = SyncLiveness(self.client, dead_after=3.0)
        self.infos = infos
        self.halt = threading.Event()
        for info in infos:
            self.liveness.register(info.worker_id, msgpack_encoder.encode(info))
        self.beat()

    def beat(self) -> None:
        for info in self.infos:
            self.liveness.heartbeat(info.worker_id)

    def run(self) -> None:
        while not self.halt.wait(0.5):
            self.beat()

    def stop(self) -> None:
        self.halt.set()
        self.join(5)
        for info in self.infos:
            for partition in keys.partitions():
                self.client.zrem(keys.workers(partition), info.worker_id)
            self.client.delete(keys.worker(info.worker_id))
        self.client.close()


def fill_audit(client: redis.Redis, count: int) -> str:
    """``count`` entries over the last hour, oldest first, each in its execution's partition's
    stream; the id of an execution among them."""
    now = int(time.time() * 1000)
    pipe = client.pipeline(transaction=False)
    some = ""
    for i in range(count):
        finished = now - 3_600_000 + i * 3_600_000 // count
        exec_id = keys.new_execution_id()
        some = some or exec_id
        status = STATUSES[i % len(STATUSES)]
        pipe.xadd(keys.audit(keys.partition_of(exec_id)), {
            "execution_id": exec_id, "request_id": f"req-{i}", "job_id": "", "principal": PRINCIPALS[i % 4],
            "tool": tool_name(i % GROUPS, i % TOOLS_PER_GROUP), "effect": "read", "status": status,
            "error_code": "" if status == "completed" else ("TIMEOUT" if status == "timed_out" else "UPSTREAM_ERROR"),
            "duration_ms": 12 + i % 50, "queued_at": finished - 40, "started_at": finished - 30,
            "finished_at": finished, "replayed": "", "via": ("http", "sse", "mcp", "job")[i % 4],
            "worker": f"bench-w{i % GROUPS:02d}00"}, id=f"{finished}-{i}")
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    return some


def time_pages(base: str, pages: list[tuple[str, str, str]], loads: int) -> list[PageTime]:
    """Each of ``pages`` (name, path, a text its answer must hold) loaded ``loads`` times."""
    measured = []
    with httpx.Client(base_url=base, timeout=30) as client:
        for name, path, marker in pages:
            times, ok = [], True
            for _ in range(loads):
                started = time.perf_counter()
                answer = client.get(path)
                times.append((time.perf_counter() - started) * 1000)
                ok = ok and answer.status_code == 200 and marker in answer.text
            times.sort()
            route = re.sub(r"exec_[0-9a-f-]{36}", "{execution_id}", path.split("?")[0])
            measured.append(PageTime(name, path, route, times[len(times) // 2], times[-1], ok))
    return measured
