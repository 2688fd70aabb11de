"""The cost-curve scenarios of ``bin/bench`` (issue 35): each measures one figure at several sizes
(``bench.sizes``) and adds a ``Curve`` to the report, whose slope says how the cost grows.

Time is each point's p50 at one client (wrk, as the main table's rows); CPU per call is each
kind of process's CPU time during that measurement over the calls answered in it.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import TYPE_CHECKING

import httpx

from bench import backlog, many_tools, wrk
from bench.crowd import hold_streams, raise_fd_limit
from bench.curves import Column, Curve, Point
from bench.refresh import refresh_cost
from bench.sizes import MIB, call, echo_arguments, sse_times
from carmy_worker.store.keys import pending

if TYPE_CHECKING:
    from bench.procs import Processes
    from bench.report import Row
    from bench.scenarios import Bench

# Room for a result of 1 MiB with its envelope (a body's limit, 1 MiB, is not a setting: the
# largest body is that, envelope included).
BIG_RESULT = {"CARMY_MAX_RESULT_BYTES": str(4 * MIB)}


def one_client(b: Bench, label: str, base: str, request: wrk.Request, procs: Processes, *,
               settle: bool = True) -> Row:
    """One point: measured as the main table's rows are (warm-up, wrk, CPU), kept out of that table."""
    return b.load(label, label, base, request, 1, procs, in_table=False, settle=settle)


def per_call(row_cpu: dict[str, float], prefix: str) -> dict[str, float]:
    return {f"{prefix}{kind} CPU µs/call": us for kind, us in row_cpu.items()}


def cost_payload(b: Bench) -> None:
    """The echo tool, its argument and result of each size, beside bare Starlette's in-process echo."""
    s = b.config.curve_sizes
    columns = [Column("p50 ms"), Column("api CPU µs/call"), Column("worker CPU µs/call"),
               Column("redis CPU µs/call"), Column("bare p50 ms", fitted=False),
               Column("bare uvicorn CPU µs/call", fitted=False), Column("× bare p50", work=0, fitted=False)]
    curve = Curve("cost_payload", "Arguments and results by size (echo tool, 1 client)", "bytes each way", columns)
    points: dict[int, dict[str, float]] = {n: {} for n in s.payload_bytes}
    with b.processes("cost_payload") as procs:
        procs.carmy_worker(env=BIG_RESULT)
        _, base = procs.carmy_api(tool="echo")
        for n in s.payload_bytes:
            row = one_client(b, f"Carmy echo, {n:,} bytes", base, call("echo", echo_arguments(n)), procs)
            points[n].update({"p50 ms": row.p50_ms, **per_call(row.cpu_us_per_call, "")})
    b.redis.flush()
    with b.processes("cost_payload_bare") as procs:
        _, base = procs.uvicorn("bench.baselines:bare_app")
        for n in s.payload_bytes:
            row = one_client(b, f"bare echo, {n:,} bytes", base, call("echo", echo_arguments(n)), procs)
            points[n].update({"bare p50 ms": row.p50_ms, **per_call(row.cpu_us_per_call, "bare ")})
            points[n]["× bare p50"] = points[n]["p50 ms"] / row.p50_ms
    curve.points = [Point(n, v) for n, v in points.items()]
    b.report.curves.append(curve)


def cost_progress(b: Bench) -> None:
    """A tool reporting progress N times per execution, to JSON callers (wrk) and SSE callers
    (every event relayed), beside bare Starlette calling the same tool in-process."""
    s = b.config.curve_sizes
    columns = [Column("JSON p50 ms"), Column("SSE p50 ms, to the end"), Column("api CPU µs/call"),
               Column("worker CPU µs/call"), Column("redis CPU µs/call"), Column("bare p50 ms", fitted=False)]
    curve = Curve("cost_progress", "Progress events per execution (1 client)", "events", columns,
                  notes=["The point at 0 events is left out of the slopes (no logarithm); CPU is the JSON calls'."])
    points: dict[int, dict[str, float]] = {n: {} for n in s.progress_events}
    with b.processes("cost_progress") as procs:
        procs.carmy_worker()
        _, base = procs.carmy_api(tool="emit")
        for n in s.progress_events:
            row = one_client(b, f"Carmy, {n} progress events", base, call("emit", {"events": n}), procs)
            streamed = sse_times(base, "emit", {"events": n}, s.calls)
            points[n].update({"JSON p50 ms": row.p50_ms, "SSE p50 ms, to the end": streamed.p50_ms,
                              **per_call(row.cpu_us_per_call, "")})
    b.redis.flush()
    with b.processes("cost_progress_bare") as procs:
        _, base = procs.uvicorn("bench.baselines:bare_app")
        for n in s.progress_events:
            row = one_client(b, f"bare, {n} progress events", base, call("emit", {"events": n}), procs)
            points[n]["bare p50 ms"] = row.p50_ms
    curve.points = [Point(n, v) for n, v in points.items()]
    b.report.curves.append(curve)


def cost_catalog(b: Bench) -> None:
    """A worker serving N tools: its start, the catalog's refresh, discovery and its revalidation."""
    s = b.config.curve_sizes
    columns = [Column("worker start s"), Column("catalog refresh ms"), Column("refresh CPU ms"),
               Column("refresh, a worker alike, CPU ms"), Column("/.well-known/agent p50 ms", work=0),
               Column("/agent/tools 200 p50 ms"), Column("/agent/tools 304 p50 ms", work=0),
               Column("/agent/tools KiB", fitted=False)]
    curve = Curve("cost_catalog", "Catalog size (one worker serving N tools, 1 client)", "tools", columns,
                  notes=["Catalog refresh: `Catalog.refresh()` in-process into an empty catalog (reads every "
                         "worker's info, builds the view and its ETag), the work each API process does when a "
                         "worker comes or goes; the median of five, and its CPU. A worker alike: the CPU of a "
                         "refresh of a catalog that knows the worker once one more of the same tools registered "
                         "(bench/refresh.py). 304: `/agent/tools` with its ETag in `If-None-Match`."])
    for n in s.catalog_tools:
        with b.processes(f"cost_catalog_{n}") as procs:
            started = time.monotonic()
            procs.carmy_worker("bench.many_tools", env={"BENCH_TOOLS": str(n)})
            start_s = time.monotonic() - started
            _, base = procs.carmy_api(tool=many_tools.name(n - 1))
            listed = httpx.get(base + "/agent/tools", timeout=30)
            discovery = one_client(b, f"discovery, {n} tools", base, wrk.Request("/.well-known/agent"), procs)
            full = one_client(b, f"tools, {n} tools", base, wrk.Request("/agent/tools"), procs)
            cached = one_client(b, f"tools 304, {n} tools", base, wrk.Request(
                "/agent/tools", headers=(("if-none-match", listed.headers["etag"]),), expect_status=304), procs)
            # Last: the workers alike it registers are in the API's catalog too.
            refresh = asyncio.run(refresh_cost(b.redis.url, 5))
        b.redis.flush()
        curve.points.append(Point(n, {"worker start s": start_s, "catalog refresh ms": refresh.wall_ms,
                                      "refresh CPU ms": refresh.cpu_ms,
                                      "refresh, a worker alike, CPU ms": refresh.alike_cpu_ms,
                                      "/.well-known/agent p50 ms": discovery.p50_ms,
                                      "/agent/tools 200 p50 ms": full.p50_ms, "/agent/tools 304 p50 ms": cached.p50_ms,
                                      "/agent/tools KiB": len(listed.content) / 1024}))
    b.report.curves.append(curve)


def cost_idle(b: Bench) -> None:
    """N idle SSE streams on one API process: memory per stream, and a no-op's latency meanwhile."""
    s = b.config.curve_sizes
    raise_fd_limit()
    columns = [Column("api KiB/stream", work=0), Column("worker KiB/stream", work=0),
               Column("other calls p50 ms", work=0), Column("other calls p99 ms", work=0),
               Column("api CPU µs/call", work=0), Column("worker CPU µs/call", work=0),
               Column("redis CPU µs/call", work=0)]
    curve = Curve("cost_idle", "Idle SSE streams on one API process (a no-op at 1 client meanwhile)", "streams",
                  columns, notes=["Size 0: the same no-op row before any stream was opened. CPU per call: each "
                                  "process's CPU during the no-op's measurement over the no-op calls, the "
                                  "streams' upkeep included (keep-alives, rechecks, leases)."])
    most = max(s.idle_streams)
    # Every stream's execution running (a slot each), so that the no-op has a free slot; none
    # dropped for waiting, none refused for admission.
    with b.processes("cost_idle") as procs:
        worker = procs.carmy_worker(env={"CARMY_CONCURRENCY": str(most + 100)})
        api, base = procs.carmy_api(env={"CARMY_MAX_PENDING": str(most * 2), "CARMY_QUEUE_TIMEOUT": "900"})
        row = one_client(b, "no-op, no stream open", base, call("noop", {}), procs)
        curve.points.append(Point(0, {"other calls p50 ms": row.p50_ms, "other calls p99 ms": row.p99_ms,
                                      **per_call(row.cpu_us_per_call, "")}))
        for n in s.idle_streams:
            rows: list[Row] = []
            meanwhile = functools.partial(other_calls, b, f"no-op, {n} streams open", base, procs, rows)
            held = asyncio.run(hold_streams(base, n, api.pid, worker.pid, meanwhile))
            curve.points.append(Point(n, {"api KiB/stream": held.api_kib_per_stream,
                                          "worker KiB/stream": held.worker_kib_per_stream,
                                          "other calls p50 ms": rows[0].p50_ms, "other calls p99 ms": rows[0].p99_ms,
                                          **per_call(rows[0].cpu_us_per_call, "")}))
            b.redis.wait_settled(pending(0), timeout=120)  # the streams' executions cancelled, as their callers left
    b.redis.flush()
    b.report.curves.append(curve)


def other_calls(b: Bench, label: str, base: str, procs: Processes, out: list[Row]) -> None:
    out.append(one_client(b, label, base, call("noop", {}), procs, settle=False))  # the streams stay pending


def cost_waiting(b: Bench) -> None:
    """Executions waiting in one queue, and jobs queued an hour ahead: memory per item, and the
    time of one SUBMIT, LEASE or CREATE more at each length."""
    s = b.config.curve_sizes
    waiting = asyncio.run(backlog.waiting_curve(b.redis.url, s.waiting, s.calls))
    b.report.curves.append(Curve(
        "cost_waiting", "Executions waiting in one queue (no worker; the store's Submit and Leases in-process)",
        "executions", [Column("bytes/execution", work=0), Column("SUBMIT µs", work=0), Column("LEASE µs", work=0)],
        [Point(w.items, {"bytes/execution": w.bytes_per_item, "SUBMIT µs": w.submit_us, "LEASE µs": w.lease_us})
         for w in waiting]))
    b.redis.flush()
    queued = asyncio.run(backlog.queued_curve(b.redis.url, s.queued_jobs, s.calls))
    b.report.curves.append(Curve(
        "cost_waiting", "Jobs queued an hour ahead (JobStore.create in-process)", "jobs",
        [Column("bytes/job", work=0), Column("CREATE µs", work=0)],
        [Point(q.jobs, {"bytes/job": q.bytes_per_job, "CREATE µs": q.create_us}) for q in queued]))
    b.redis.flush()
