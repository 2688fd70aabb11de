"""Collects the numbers of a run and prints them as markdown: the main table, ratios, the
scale-out curve, the in-flight check, jobs (issue 30) and the targets of the performance issue."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from bench import curves as cost_curves
from bench.console import ConsoleResult
from bench.inflight import InflightResult
from bench.jobs import DueResult, MemoryResult

# The performance targets (issue: "Targets").
TARGET_P50_MS = 2.0
TARGET_RPS = 1000.0
TARGET_VS_ARQ = 10.0
TARGET_RSS_MIB = 150.0
TARGET_REDIS_CONNECTIONS = 20
# Issue 35's (issue 14's were 0.20 and 6×), as ratios to the baselines of the same run (absolute
# figures move 3-4x by the day), and Redis's CPU per execution at 64 clients.
TARGET_VS_BARE_RPS = 0.30  # no-op, 64 clients: of bare Starlette's throughput
TARGET_VS_BARE_P50 = 4.0  # no-op, 1 client: times bare Starlette's p50
TARGET_SSE_VS_BARE_P50 = 3.0  # SSE's time to its first event, 1 client: times bare Starlette's p50
TARGET_REDIS_US = 120.0  # no-op, 64 clients: µs of Redis CPU per execution
TARGET_SLOT_SHARE = 0.90  # scale-out: of what the worker slots allow
TARGET_CONSOLE_MS = 1000  # every console page, at the size (bench/console.py)
# Issue 34: with more than one partition, no primary of the cluster does more than this share of
# the primaries' Redis CPU (16 partitions fall 7/5/4 on three primaries: 44 % at most).
TARGET_BUSIEST_PRIMARY = 0.50


def times(ratio: float) -> str:
    # Three decimals below 1: a share of 0.296 printed as 0.30 would read as a 0.30 target met.
    return f"{ratio:.3f}×" if ratio < 1 else f"{ratio:.1f}×"


@dataclass(frozen=True)
class Row:
    key: str  # how ratios refer to the row
    label: str
    clients: int
    p50_ms: float
    p99_ms: float
    rps: float | None  # None where calls per second mean nothing (latency-only rows)
    errors: int = 0
    cpu: str = ""  # share of one core each process used while measured, e.g. "api 95%, worker 40%+38%"
    cpu_us_per_call: dict[str, float] = field(default_factory=dict)  # per kind of process (all its processes)


@dataclass(frozen=True)
class Spread:
    """A ratio over a run's rounds (``bin/bench --rounds``): its median and its range."""

    median: float
    low: float
    high: float
    rounds: int

    def text(self) -> str:
        if self.rounds < 2:
            return times(self.median)
        return f"{times(self.median)} ({times(self.low)}–{times(self.high)})"


def median_row(rows: list[Row]) -> Row:
    """One row of several rounds' measurements of it: the median of each figure (a row's errors
    are added up). Its CPU text is the one of the round whose p50 is the median."""
    middle = sorted(rows, key=lambda r: r.p50_ms)[len(rows) // 2]
    rates = [r.rps for r in rows if r.rps is not None]
    return replace(
        middle, p50_ms=statistics.median(r.p50_ms for r in rows), p99_ms=statistics.median(r.p99_ms for r in rows),
        rps=statistics.median(rates) if rates else None, errors=sum(r.errors for r in rows),
        cpu_us_per_call={kind: statistics.median(r.cpu_us_per_call.get(kind, 0.0) for r in rows)
                         for kind in middle.cpu_us_per_call})


def _find(rows: list[Row], key: str) -> Row | None:
    return next((row for row in rows if row.key == key), None)


def _ratio(rows: list[Row], top: str, bottom: str, by_rps: bool) -> float | None:
    a, b = _find(rows, top), _find(rows, bottom)
    if a is None or b is None:
        return None
    if by_rps:
        return a.rps / b.rps if a.rps and b.rps else None
    return a.p50_ms / b.p50_ms if b.p50_ms else None


@dataclass(frozen=True)
class ScalePoint:
    workers: int
    row: Row
    ideal_rps: float  # what the worker slots allow: min(clients, workers × concurrency) / tool time


@dataclass(frozen=True)
class ClusterPoint:
    """A no-op row on a Redis Cluster (bench/cluster.py): its partition count, the measurement,
    and each primary's share of the primaries' Redis CPU while measured, by port."""

    partitions: int
    row: Row
    shares: dict[int, float] = field(default_factory=dict)
    redis_cpu_s: float = 0.0  # the primaries' Redis CPU during the measurement, together
    calls: int = 0  # answered during the measurement

    @property
    def busiest(self) -> float:
        return max(self.shares.values(), default=1.0)


@dataclass
class Report:
    header: list[str]
    rows: list[Row] = field(default_factory=list)
    scale: list[ScalePoint] = field(default_factory=list)
    inflight: InflightResult | None = None
    jobs_due: DueResult | None = None
    jobs_memory: MemoryResult | None = None
    console: ConsoleResult | None = None
    curves: list[cost_curves.Curve] = field(default_factory=list)  # issue 35's cost curves
    cluster_single: Row | None = None  # issue 34: the no-op row on one Redis, beside ``cluster``
    cluster: list[ClusterPoint] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    log_errors: list[str] = field(default_factory=list)  # reported, but not a failure of the run
    # With --rounds N > 1: each round's rows (the first round's are every scenario's, the later
    # ones' those of the scenarios played again); ``rows`` then holds each row's median.
    rounds: list[list[Row]] = field(default_factory=list)

    def get(self, key: str) -> Row | None:
        return _find(self.rows, key)

    def spread(self, top: str, bottom: str, *, by_rps: bool) -> Spread | None:
        """Row ``top``'s figure over row ``bottom``'s (req/s, else p50), taken in each round that
        measured both and then the median: a ratio of two medians would pair figures of different
        rounds, which these machines' swings make meaningless. Where no round measured both (a
        row played once), the ratio of the rows as they are."""
        samples = [value for rows in self.rounds if (value := _ratio(rows, top, bottom, by_rps)) is not None]
        if not samples:  # one round, or a row played once (arq's, tracing's): the rows as they are
            value = _ratio(self.rows, top, bottom, by_rps)
            samples = [] if value is None else [value]
        if not samples:
            return None
        return Spread(statistics.median(samples), min(samples), max(samples), len(samples))

    def render(self) -> str:
        parts = [self.header_lines(), self.table(), self.ratios(), self.cpu_per_call(), self.scale_table(),
                 self.inflight_lines(), self.jobs_due_lines(), self.jobs_memory_lines(), self.console_lines(),
                 self.cluster_lines(), cost_curves.render_all(self.curves), self.targets(),
                 self.log_error_lines(), self.problem_lines()]
        return "\n\n".join(part for part in parts if part) + "\n"

    def header_lines(self) -> str:
        return "\n".join(self.header)

    def table(self) -> str:
        if not self.rows:  # only scenarios with sections of their own were run (--only)
            return ""
        lines = ["| scenario | clients | p50 ms | p99 ms | req/s | errors | CPU (of one core) |",
                 "|---|--:|--:|--:|--:|--:|---|"]
        for r in self.rows:
            rps = "" if r.rps is None else f"{r.rps:,.0f}"
            lines.append(f"| {r.label} | {r.clients} | {r.p50_ms:.3f} | {r.p99_ms:.3f} | {rps} | {r.errors} "
                         f"| {r.cpu} |")
        return "\n".join(lines)

    def ratio(self, text: str, top: str, bottom: str, *, by_rps: bool) -> str | None:
        a, b, spread = self.get(top), self.get(bottom), self.spread(top, bottom, by_rps=by_rps)
        if a is None or b is None or spread is None:
            return None
        over = f"; {times(spread.low)}–{times(spread.high)} over {spread.rounds} rounds" if spread.rounds > 1 else ""
        if by_rps:
            return f"- {text}: **{times(spread.median)}** ({a.rps or 0:,.0f} vs {b.rps or 0:,.0f} req/s{over})"
        return (f"- {text}: **{times(spread.median)}** ({a.p50_ms:.3f} vs {b.p50_ms:.3f} ms, "
                f"{a.p50_ms - b.p50_ms:+.3f} ms{over})")

    def ratios(self) -> str:
        lines = [
            self.ratio("Carmy vs arq textbook, throughput at 64 clients", "ours_64", "arq_64", by_rps=True),
            self.ratio("Carmy vs bare Starlette, throughput at 64 clients", "ours_64", "bare_64", by_rps=True),
            self.ratio("arq textbook vs Carmy, p50 at 1 client", "arq_1", "ours_1", by_rps=False),
            self.ratio("Carmy vs bare Starlette, p50 at 1 client", "ours_1", "bare_1", by_rps=False),
            self.ratio("Carmy tracing on vs off, p50 at 1 client", "traced_1", "ours_1", by_rps=False),
            self.ratio("Carmy tracing on vs off, throughput at 64 clients", "traced_64", "ours_64", by_rps=True),
            self.ratio("Carmy vs Redis round-trip floor, p50 at 1 client", "ours_1", "floor", by_rps=False),
            self.ratio("Carmy vs the shape's floor, p50 at 1 client", "ours_1", "shape_1", by_rps=False),
            self.ratio("the shape's floor vs bare Starlette, p50 at 1 client", "shape_1", "bare_1", by_rps=False),
            self.ratio("Discovery with If-None-Match (304) vs without (200), throughput at 64 clients",
                       "discovery_304_64", "discovery_200_64", by_rps=True),
        ]
        found = [line for line in lines if line]
        return "Ratios:\n\n" + "\n".join(found) if found else ""

    def cpu_per_call(self) -> str:
        """The CPU each kind of process spent per answered call in the Carmy no-op rows, in µs."""
        lines = []
        for key in ("ours_1", "ours_64"):
            row = self.get(key)
            if row is not None and row.cpu_us_per_call:
                spent = ", ".join(f"{kind} {us:,.0f}" for kind, us in row.cpu_us_per_call.items())
                lines.append(f"- {row.label}, {row.clients} client{'s' if row.clients > 1 else ''}: {spent}")
        return "CPU per execution (µs, all processes of a kind together):\n\n" + "\n".join(lines) if lines else ""

    def scale_table(self) -> str:
        if not self.scale:
            return ""
        lines = [f"Scale-out (tool sleeps 50 ms, 1 API, {self.scale[0].row.clients} clients):", "",
                 "| workers | req/s | p50 ms | p99 ms | slots allow req/s | share | errors | CPU (of one core) |",
                 "|--:|--:|--:|--:|--:|--:|--:|---|"]
        lines += [f"| {p.workers} | {p.row.rps or 0:,.0f} | {p.row.p50_ms:.1f} | {p.row.p99_ms:.1f} "
                  f"| {p.ideal_rps:,.0f} | {(p.row.rps or 0) / p.ideal_rps:.0%} | {p.row.errors} | {p.row.cpu} |"
                  for p in self.scale]
        return "\n".join(lines)

    def inflight_lines(self) -> str:
        r = self.inflight
        if r is None:
            return ""
        p = r.peak
        return "\n".join([
            f"In flight on one API process ({r.calls} concurrent calls of a 2 s tool, "
            f"peak over {p.samples} samples):", "",
            f"- answered 200 completed: {r.ok}/{r.calls}",
            f"- HTTP connections open on the API: {p.http_connections}",
            f"- API RSS: {p.rss_mib:.1f} MiB while in flight (VmHWM over its life: {r.hwm_mib:.1f} MiB)",
            f"- API connections to Redis: {p.redis_connections} (/proc), {p.redis_clients} (Redis CLIENT LIST)",
        ])

    def jobs_due_lines(self) -> str:
        """Jobs due at once, and how fast they started next to plain executions on the same
        processes in the same run (absolute figures move 3-4x between days, the ratio less)."""
        r = self.jobs_due
        if r is None:
            return ""
        lines = [f"Jobs due in the same second ({r.jobs:,} no-op jobs, one run_at, 1 API + 2 workers; "
                 "ms from run_at on Redis's clock):", "",
                 f"- created with POST /agent/jobs over {r.connections} connections: {r.jobs:,} in "
                 f"{r.create_seconds:.2f} s ({r.jobs / r.create_seconds:,.0f}/s), the last {r.slack_ms:,} ms "
                 "before run_at",
                 f"- all started after **{r.all_started_ms:,} ms** ({r.starts_per_s:,.0f} starts/s), all finished "
                 f"after {r.all_finished_ms:,} ms"]
        if r.plain_rps:
            lines.append(f"- started at **{times(r.starts_per_s / r.plain_rps)}** the rate of plain no-op executions "
                         f"on the same processes ({r.plain_rps:,.0f}/s at 64 clients)")
        lines += [f"- lateness (first attempt's started_at − run_at): p50 {r.lateness_p50_ms:,} ms, "
                  f"p99 {r.lateness_p99_ms:,} ms",
                  f"- {r.jobs - r.not_succeeded:,} succeeded, {r.retried} took more than one attempt, "
                  f"{r.early} attempts started before run_at"]
        if r.cpu_us_per_job:
            spent = ", ".join(f"{kind} {us:,.0f}" for kind, us in r.cpu_us_per_job.items() if us >= 0.5)
            plain = ", ".join(f"{kind} {us:,.0f}" for kind, us in r.plain_cpu_us.items())
            lines.append(f"- CPU per job, run_at to the last finish (µs): {spent}"
                         + (f"; per plain execution: {plain}" if plain else "") + f" (of one core: {r.cpu})")
        return "\n".join(lines)

    def jobs_memory_lines(self) -> str:
        r = self.jobs_memory
        if r is None:
            return ""
        return (f"Redis memory per queued job ({r.jobs:,} jobs due in an hour, made with JobStore.create, "
                f"{r.arguments_bytes}-byte arguments): **{r.bytes_per_job:,.0f} bytes** (used_memory "
                f"{r.used_before / 2**20:,.1f} → {r.used_after / 2**20:,.1f} MiB; made at "
                f"{r.jobs / r.create_seconds:,.0f}/s)")

    def console_lines(self) -> str:
        r = self.console
        if r is None:
            return ""
        lines = [f"Console pages ({r.entries:,} audit entries, {r.workers} live workers serving {r.tools:,} tools, "
                 "1,000 queued jobs; one client, one page after another; ms):", "",
                 "| page | p50 | slowest |", "|---|--:|--:|"]
        lines += [f"| {p.name} (`{p.route}`) | {p.p50_ms:,.1f} | {p.max_ms:,.1f} |" for p in r.pages]
        return "\n".join(lines)

    def cluster_lines(self) -> str:
        """The no-op rows on the cluster against one Redis in the same run, and how the Redis work
        spread over the primaries."""
        single = self.cluster_single
        if not self.cluster or single is None or not single.rps:
            return ""
        lines = [f"Redis Cluster (3 primaries + 3 replicas on this machine; no-op over HTTP, 1 API + 2 workers, "
                 f"{single.clients} clients) against one Redis ({single.rps:,.0f} req/s, p50 {single.p50_ms:.3f} ms):",
                 "", "| partitions | req/s | vs one Redis | p50 ms | p99 ms | primaries' Redis CPU per call, µs "
                 "| each primary's share of it |", "|--:|--:|--:|--:|--:|--:|---|"]
        for p in self.cluster:
            rps = p.row.rps or 0.0
            per_call_us = p.redis_cpu_s / p.calls * 1e6 if p.calls else 0.0
            shares = " / ".join(f"{share:.0%}" for share in p.shares.values()) or "-"
            lines.append(f"| {p.partitions} | {rps:,.0f} | {times(rps / single.rps)} | {p.row.p50_ms:.3f} "
                         f"| {p.row.p99_ms:.3f} | {per_call_us:,.0f} | {shares} |")
        # Where a cluster's calls cost more: its clients (API, workers) or Redis.
        spent = [(f"{p.partitions} partition{'s' if p.partitions > 1 else ''}", p.row.cpu_us_per_call)
                 for p in self.cluster]
        lines += ["", "CPU per call (µs, all processes of a kind together): "
                  + "; ".join(f"{name}: " + ", ".join(f"{kind} {us:,.0f}" for kind, us in cpu.items())
                              for name, cpu in [("one Redis", single.cpu_us_per_call), *spent] if cpu)]
        return "\n".join(lines)

    def targets(self) -> str:
        checks: list[tuple[str, str, bool]] = []
        if (ours_1 := self.get("ours_1")) is not None:
            checks.append((f"no-op, 1 client: p50 ≤ {TARGET_P50_MS:g} ms", f"{ours_1.p50_ms:.3f} ms",
                           ours_1.p50_ms <= TARGET_P50_MS))
        ours_64 = self.get("ours_64")
        if ours_64 is not None and ours_64.rps is not None:
            checks.append((f"no-op, 64 clients, 1 API + 2 workers: ≥ {TARGET_RPS:,.0f}/s", f"{ours_64.rps:,.0f}/s",
                           ours_64.rps >= TARGET_RPS))
            if (vs_arq := self.spread("ours_64", "arq_64", by_rps=True)) is not None:
                checks.append((f"same, ≥ {TARGET_VS_ARQ:g}× arq's textbook pattern", vs_arq.text(),
                               vs_arq.median >= TARGET_VS_ARQ))
        if (of_bare := self.spread("ours_64", "bare_64", by_rps=True)) is not None:
            checks.append((f"same, ≥ {TARGET_VS_BARE_RPS:g}× bare Starlette's throughput", of_bare.text(),
                           of_bare.median >= TARGET_VS_BARE_RPS))
        if ours_64 is not None and (redis_us := ours_64.cpu_us_per_call.get("redis")) is not None:
            checks.append((f"same, Redis CPU per execution ≤ {TARGET_REDIS_US:g} µs", f"{redis_us:,.0f} µs",
                           redis_us <= TARGET_REDIS_US))
        for key, what, most in (("ours_1", "p50", TARGET_VS_BARE_P50),
                                ("sse_first", "SSE time to first event", TARGET_SSE_VS_BARE_P50)):
            if (slower := self.spread(key, "bare_1", by_rps=False)) is not None:
                checks.append((f"no-op, 1 client: {what} ≤ {most:g}× bare Starlette's p50",
                               slower.text(), slower.median <= most))
        for p in self.scale:
            share = (p.row.rps or 0) / p.ideal_rps
            checks.append((f"scale-out, {p.workers} worker{'s' if p.workers > 1 else ''}: "
                           f"≥ {TARGET_SLOT_SHARE:.0%} of what the slots allow, no errors",
                           f"{share:.1%}, {p.row.errors} errors", share >= TARGET_SLOT_SHARE and not p.row.errors))
        if (r := self.inflight) is not None:
            checks.append((f"{r.calls} in flight: API RSS ≤ {TARGET_RSS_MIB:g} MiB", f"{r.peak.rss_mib:.1f} MiB",
                           r.peak.rss_mib <= TARGET_RSS_MIB))
            conns = max(r.peak.redis_connections, r.peak.redis_clients)
            checks.append((f"{r.calls} in flight: ≤ {TARGET_REDIS_CONNECTIONS} Redis connections from the API",
                           str(conns), conns <= TARGET_REDIS_CONNECTIONS))
        if (c := self.console) is not None:
            pages = [p for p in c.pages if p.path.startswith("/console")]
            slowest = max(pages, key=lambda p: p.p50_ms)
            checks.append((f"console pages, {c.entries:,} audit entries and {c.workers} workers: p50 ≤ "
                           f"{TARGET_CONSOLE_MS:,} ms", f"{slowest.p50_ms:,.0f} ms ({slowest.name})",
                           slowest.p50_ms <= TARGET_CONSOLE_MS and all(p.ok for p in pages)))
        for point in self.cluster:
            if point.partitions > 1:
                checks.append((f"Redis Cluster, {point.partitions} partitions: no primary over "
                               f"{TARGET_BUSIEST_PRIMARY:.0%} of the Redis CPU", f"{point.busiest:.0%}",
                               point.busiest <= TARGET_BUSIEST_PRIMARY))
        if not checks:
            return ""
        lines = ["| target | measured | met |", "|---|--:|:-:|"]
        lines += [f"| {name} | {value} | {'yes' if ok else '**no**'} |" for name, value, ok in checks]
        return "Targets:\n\n" + "\n".join(lines)

    def log_error_lines(self) -> str:
        if not self.log_errors:
            return ""
        return ("Errors in the servers' logs (callers saw them only where a row counts errors):\n\n"
                + "\n".join(f"- {line}" for line in self.log_errors))

    def problem_lines(self) -> str:
        return "Problems:\n\n" + "\n".join(f"- {p}" for p in self.problems) if self.problems else ""
