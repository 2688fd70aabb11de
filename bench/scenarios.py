"""The scenarios of a run. Each starts the processes it needs, measures, adds rows to the
report and stops its processes, so no scenario competes with another for the CPUs."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench import cluster, console, cost_rows, inflight, jobs, latency, redis_floor, shape_floor, sizes, wrk
from bench.processes import RedisServer
from bench.procs import START_TIMEOUT, CpuMeter, Processes
from bench.report import Report, Row, ScalePoint
from carmy_worker.store.keys import pending

JSON = (("content-type", "application/json"),)
COMPLETED = '"status":"completed"'
CLIENTS = 64
# The scale-out rows' clients: more than 4 workers' slots (64), so that the slots, not the
# clients, bound what the workers do. At 64 clients and 4 workers each client would hold a
# slot only while its call is in a worker: its HTTP round trip would count as the slot idling.
SCALE_CLIENTS = 256
WORKER_CONCURRENCY = 16  # CARMY_CONCURRENCY's default, passed explicitly so the scale-out bound is right
SLEEP50_SECONDS = 0.05


def execute(tool: str) -> wrk.Request:
    return wrk.Request("/agent/execute", method="POST", body=f'{{"tool":"{tool}","arguments":{{}}}}',
                       headers=JSON, expect_text=COMPLETED)


@dataclass(frozen=True)
class Config:
    seconds: float  # each wrk measurement
    warmup: float  # a wrk run before each measurement, not counted (0: none)
    sse_calls: int
    floor_round_trips: int
    inflight_calls: int
    scale_workers: tuple[int, ...]
    due_jobs: int  # jobs due in the same second
    queued_jobs: int  # jobs queued an hour ahead, for Redis's memory per job
    console_loads: int  # loads of each console page
    curve_sizes: sizes.Sizes  # the sizes of the cost curves (issue 35)


FULL = Config(seconds=5, warmup=1, sse_calls=200, floor_round_trips=2000, inflight_calls=500,
              scale_workers=(1, 2, 4), due_jobs=10_000, queued_jobs=100_000, console_loads=21,
              curve_sizes=sizes.FULL)
QUICK = Config(seconds=1, warmup=0, sse_calls=20, floor_round_trips=200, inflight_calls=50, scale_workers=(1, 2),
               due_jobs=1000, queued_jobs=10_000, console_loads=3, curve_sizes=sizes.QUICK)


class Bench:
    """What every scenario shares: the configuration, the private Redis, the report."""

    def __init__(self, config: Config, workdir: Path, redis: RedisServer, report: Report) -> None:
        self.config = config
        self.workdir = workdir
        self.redis = redis
        self.report = report
        self.started: list[Processes] = []

    def processes(self, scenario: str) -> Processes:
        procs = Processes(self.workdir, self.redis.url, scenario)
        self.started.append(procs)
        return procs

    def log_errors(self) -> list[str]:
        """Errors the servers logged during the run (read once they have all stopped)."""
        return [line for procs in self.started for line in procs.log_errors()]

    def load(self, key: str, label: str, base: str, request: wrk.Request, clients: int, procs: Processes,
             *, in_table: bool = True, settle: bool = True) -> Row:
        """Warm up, measure with wrk, add the row (to the main table unless ``in_table`` is false);
        unexpected answers become problems. ``settle=False``: measure after the warm-up without
        waiting for every pending execution to end (some are meant to stay, as idle streams' do).

        The CPU each process used during the measurement goes with the row: on a small machine
        it tells which process is the bottleneck.
        """
        if self.config.warmup:
            wrk.run(base, request, clients=clients, seconds=self.config.warmup, workdir=self.workdir)
            # wrk ends its warm-up by closing every connection: the calls still waiting there are
            # cancelled for their departed callers. Measured from the start, the first tenth of a
            # second or more of a 50 ms tool at 256 clients would be those cancellations.
            if settle:
                self.redis.wait_settled(pending(0))
        with CpuMeter([*procs.procs, self.redis.proc]) as cpu:
            result = wrk.run(base, request, clients=clients, seconds=self.config.seconds, workdir=self.workdir)
        per_call = {kind: used / result.requests * 1e6 for kind, used in cpu.seconds.items()} if result.requests else {}
        row = Row(key, label, clients, result.p50_ms, result.p99_ms, result.rps, result.errors, cpu.summary, per_call)
        if in_table:
            self.report.rows.append(row)
        if result.errors or not result.requests:
            self.report.problems.append(f"{label}, {clients} clients: {result.requests} answers, "
                                        f"{result.errors} errors; first unexpected answer: {result.sample!r}")
        return row


def carmy(b: Bench) -> None:
    """Ours end to end: 1 API + 1 worker at 1 client (plus SSE), then a second worker at 64 clients."""
    with b.processes("carmy") as procs:
        procs.carmy_worker(env={"CARMY_CONCURRENCY": str(WORKER_CONCURRENCY)})
        _, base = procs.carmy_api()
        b.load("ours_1", "Carmy, no-op over HTTP (1 API + 1 worker)", base, execute("noop"), 1, procs)
        first, total = latency.sse_latency(base, "noop", b.config.sse_calls)
        b.report.rows.append(Row("sse_first", "Carmy SSE: time to first event", 1, first.p50_ms, first.p99_ms, None))
        b.report.rows.append(Row("sse_total", "Carmy SSE: time to execution.completed", 1, total.p50_ms,
                                 total.p99_ms, None))
        procs.carmy_worker(env={"CARMY_CONCURRENCY": str(WORKER_CONCURRENCY)})
        b.load("ours_64", "Carmy, no-op over HTTP (1 API + 2 workers)", base, execute("noop"), CLIENTS, procs)
        discovery(b, base, procs)
    b.redis.flush()


# Spans written to /dev/null: the cost of making and encoding them, without an exporter's network.
TRACED = {"CARMY_TRACING": "file:/dev/null"}


def traced(b: Bench) -> None:
    """``carmy`` with tracing on in the API and the workers: what the spans cost."""
    with b.processes("traced") as procs:
        procs.carmy_worker(env={"CARMY_CONCURRENCY": str(WORKER_CONCURRENCY), **TRACED})
        _, base = procs.carmy_api(env=TRACED)
        b.load("traced_1", "Carmy, no-op over HTTP, tracing on (1 API + 1 worker)", base, execute("noop"), 1, procs)
        procs.carmy_worker(env={"CARMY_CONCURRENCY": str(WORKER_CONCURRENCY), **TRACED})
        b.load("traced_64", "Carmy, no-op over HTTP, tracing on (1 API + 2 workers)", base, execute("noop"),
               CLIENTS, procs)
    b.redis.flush()


def discovery(b: Bench, base: str, procs: Processes) -> None:
    """``GET /.well-known/agent`` in full, and revalidated with its ETag (304, no body)."""
    etag = httpx.get(base + "/.well-known/agent").headers["etag"]
    full = wrk.Request("/.well-known/agent", expect_text='"tools_version"')
    cached = wrk.Request("/.well-known/agent", headers=(("if-none-match", etag),), expect_status=304)
    for clients in (1, CLIENTS):
        b.load(f"discovery_200_{clients}", "Carmy discovery GET, 200", base, full, clients, procs)
        b.load(f"discovery_304_{clients}", "Carmy discovery GET + If-None-Match, 304", base, cached, clients, procs)


def bare(b: Bench) -> None:
    """The same tool called in-process by a bare Starlette endpoint: the HTTP upper bound."""
    with b.processes("bare") as procs:
        _, base = procs.uvicorn("bench.baselines:bare_app")
        b.load("bare_1", "bare Starlette, no-op in-process", base, execute("noop"), 1, procs)
        b.load("bare_64", "bare Starlette, no-op in-process", base, execute("noop"), CLIENTS, procs)


def arq_textbook(b: Bench) -> None:
    """arq's textbook pattern, arq defaults: 1 API + 1 arq worker at 1 client, + 1 worker at 64."""
    with b.processes("arq_textbook") as procs:
        procs.arq_worker()
        _, base = procs.uvicorn("bench.baselines:arq_app")
        b.load("arq_1", "arq textbook (1 API + 1 arq worker)", base, execute("noop"), 1, procs)
        procs.arq_worker()
        b.load("arq_64", "arq textbook (1 API + 2 arq workers)", base, execute("noop"), CLIENTS, procs)
    b.redis.flush()


def floor(b: Bench) -> None:
    """The raw Redis round trip between two processes, with no HTTP and no records."""
    result = redis_floor.measure(b.redis.url, b.config.floor_round_trips)
    b.report.rows.append(Row("floor", "Redis floor: LPUSH → BLPOP (other process) → PUBLISH → receive", 1,
                             result.p50_us / 1000, result.p99_us / 1000, 1e6 / result.mean_us))
    b.redis.flush()


def shape(b: Bench) -> None:
    """Carmy's shape with nothing in it (bench/shape_floor.py): HTTP → LPUSH → BLPOP in a worker
    process → PUBLISH → HTTP, at one client: the least six process boundaries cost here."""
    with b.processes("shape") as procs:
        worker = procs.start("shape-worker", [sys.executable, "-m", "bench.shape_floor", "serve", b.redis.url])
        worker.wait_for_log(shape_floor.READY, START_TIMEOUT)
        _, base = procs.uvicorn("bench.shape_floor:app")
        b.load("shape_1", "the shape's floor: HTTP → LPUSH → BLPOP (worker) → PUBLISH → HTTP", base,
               execute("noop"), 1, procs)
    b.redis.flush()


def scale_out(b: Bench) -> None:
    """A 50 ms tool at ``SCALE_CLIENTS`` clients, with 1, 2, 4… workers behind one API."""
    with b.processes("scale_out") as procs:
        workers, base = 0, ""
        for target in b.config.scale_workers:
            while workers < target:
                procs.carmy_worker(env={"CARMY_CONCURRENCY": str(WORKER_CONCURRENCY)})
                workers += 1
            if not base:
                _, base = procs.carmy_api(tool="sleep50")
            row = b.load(f"scale_{workers}", f"Carmy, 50 ms tool, {workers} worker(s)", base, execute("sleep50"),
                         SCALE_CLIENTS, procs, in_table=False)
            ideal = min(SCALE_CLIENTS, workers * WORKER_CONCURRENCY) / SLEEP50_SECONDS
            b.report.scale.append(ScalePoint(workers, row, ideal))
    b.redis.flush()


def in_flight(b: Bench) -> None:
    """Many executions waiting at once on one API process: its memory and Redis connections."""
    calls = b.config.inflight_calls
    with b.processes("in_flight") as procs:
        procs.carmy_worker(env={"CARMY_CONCURRENCY": str(calls + 100)})
        api, base = procs.carmy_api(env={"CARMY_MAX_PENDING": str(calls * 4)}, tool="sleep2s")
        result = asyncio.run(inflight.hold(base, api.pid, b.redis.url, calls=calls, tool="sleep2s"))
    b.report.inflight = result
    if result.ok != calls:
        b.report.problems.append(f"in flight: {calls - result.ok} of {calls} calls did not answer 200 completed; "
                                 f"first failures: {result.failures}")
    b.redis.flush()


# One principal (anonymous) creates every job: the per-principal limit on unfinished jobs is lifted.
JOBS_API = {"CARMY_JOBS_MAX_OPEN": "0"}


def jobs_due(b: Bench) -> None:
    """``due_jobs`` no-op jobs due in the same second, 1 API + 2 workers; first, plain no-op
    executions at 64 clients on the same processes, the figure the jobs are compared with."""
    with b.processes("jobs_due") as procs:
        for _ in range(2):
            procs.carmy_worker(env={"CARMY_CONCURRENCY": str(WORKER_CONCURRENCY)})
        _, base = procs.carmy_api(env=JOBS_API)
        plain = b.load("jobs_plain_64", "Carmy, no-op over HTTP (jobs' processes)", base, execute("noop"), CLIENTS,
                       procs, in_table=False)
        b.redis.wait_settled(pending(0))
        result = jobs.due_burst(base, b.redis.url, [*procs.procs, b.redis.proc], tool="noop", count=b.config.due_jobs)
    result.plain_rps, result.plain_cpu_us = plain.rps, plain.cpu_us_per_call
    b.report.jobs_due = result
    if result.failures or result.jobs != b.config.due_jobs or result.not_succeeded or result.early:
        b.report.problems.append(
            f"jobs due: {result.jobs} of {b.config.due_jobs} created, {result.not_succeeded} did not succeed, "
            f"{result.early} attempts started before run_at; first refusals: {result.failures}")
    if result.slack_ms < 0:
        b.report.problems.append(f"jobs due: the last job was created {-result.slack_ms} ms after run_at")
    b.redis.flush()


def jobs_memory(b: Bench) -> None:
    """Redis's memory per job, ``queued_jobs`` jobs due an hour ahead (no process but Redis)."""
    b.redis.flush()
    b.report.jobs_memory = jobs.queued_memory(b.redis.url, b.config.queued_jobs)
    b.redis.flush()


# The console open (no keys, on loopback) as bin/run serves it, and the pages the issue names.
CONSOLE_API = {"CARMY_CONSOLE": "1", "CARMY_JOBS_MAX_OPEN": "0"}


def console_pages(b: Bench) -> None:
    """Every console page with 10,000 audit entries, 100 live workers serving 1,000 tools and
    1,000 queued jobs (bench/console.py), 1 API process, one client; ``GET /health`` as the floor."""
    b.redis.flush()
    client = b.redis.client()
    some_execution = console.fill_audit(client, console.ENTRIES)
    asyncio.run(jobs.create_queued(b.redis.url, console.tool_name(0, 0), 1000))
    beats = console.Heartbeats(b.redis.url, console.workers())
    beats.start()
    try:
        with b.processes("console") as procs:
            _, base = procs.carmy_api(env=CONSOLE_API, tool=console.tool_name(9, 99))
            pages = [("health", "/health", ""), ("overview", "/console", "</html>"),
                     ("executions", "/console/executions", "</html>"),
                     ("executions, a filter nothing matches (the whole trail scanned)",
                      "/console/executions?tool=nothing", "</html>"),
                     ("one execution", f"/console/executions/{some_execution}", "</html>"),
                     ("jobs", "/console/jobs", "</html>"), ("tools", "/console/tools", "</html>")]
            b.report.console = console.ConsoleResult(
                console.ENTRIES, len(beats.infos), console.GROUPS * console.TOOLS_PER_GROUP,
                console.time_pages(base, pages, b.config.console_loads))
    finally:
        beats.stop()
        client.close()
    for page in b.report.console.pages:
        if not page.ok:
            b.report.problems.append(f"console: {page.path} did not answer 200 with its page every time")
    b.redis.flush()


ALL = (carmy, traced, bare, arq_textbook, floor, shape, scale_out, in_flight, jobs_due, jobs_memory, console_pages,
       cost_rows.cost_payload, cost_rows.cost_progress, cost_rows.cost_catalog, cost_rows.cost_idle,
       cost_rows.cost_waiting, cluster.cluster_noop)
# The scenarios whose rows issue 35's targets compare as ratios: played again in each of a run's
# rounds (``bin/bench --rounds``), in this order. Others are played once.
ROUNDED = (carmy, bare, shape)

Scenario = Callable[["Bench"], None]
