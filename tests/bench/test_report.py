"""The benchmark report's checks of the targets (bench/README.md, "Targets"), its CPU per
execution and its jobs sections: what a run says was met is what its rows measured."""

from __future__ import annotations

import pytest

from bench import run as bench_run
from bench import scenarios
from bench.jobs import DueResult, MemoryResult
from bench.report import ClusterPoint, Report, Row, ScalePoint, Spread, median_row


def row(key: str, p50_ms: float, rps: float | None, *, clients: int = 1, errors: int = 0,
        cpu_us: dict[str, float] | None = None) -> Row:
    return Row(key, key, clients, p50_ms, p50_ms * 2, rps, errors, "", cpu_us or {})


def verdicts(report: Report) -> dict[str, str]:
    """Each target's line in the targets table: name -> (measured, met)."""
    table = report.targets().split("\n\n", 1)[1].splitlines()[2:]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    return {name: f"{measured} {met}" for name, measured, met in cells}


def test_issue_35s_targets_are_checked_as_ratios_to_the_baselines_of_the_same_run() -> None:
    report = Report(header=[], rows=[
        row("ours_1", 0.8, 900), row("sse_first", 0.65, None), row("bare_1", 0.2, 5000),
        row("ours_64", 20.0, 3000, clients=64, cpu_us={"worker": 100.0, "api": 110.0, "redis": 121.0}),
        row("bare_64", 5.0, 10000, clients=64),
    ], scale=[
        ScalePoint(1, row("scale_1", 800, 288, clients=256), 320),  # 90 %
        ScalePoint(2, row("scale_2", 400, 569, clients=256), 640),  # 88.9 %
        ScalePoint(4, row("scale_4", 200, 1240, clients=256, errors=3), 1280),  # 96.9 %, with errors
    ])
    got = verdicts(report)
    assert got["same, ≥ 0.3× bare Starlette's throughput"] == "0.300× yes"
    assert got["same, Redis CPU per execution ≤ 120 µs"] == "121 µs **no**"
    assert got["no-op, 1 client: p50 ≤ 4× bare Starlette's p50"] == "4.0× yes"
    assert got["no-op, 1 client: SSE time to first event ≤ 3× bare Starlette's p50"] == "3.2× **no**"
    assert got["scale-out, 1 worker: ≥ 90% of what the slots allow, no errors"] == "90.0%, 0 errors yes"
    assert got["scale-out, 2 workers: ≥ 90% of what the slots allow, no errors"] == "88.9%, 0 errors **no**"
    assert got["scale-out, 4 workers: ≥ 90% of what the slots allow, no errors"] == "96.9%, 3 errors **no**"


def test_the_cpu_per_execution_of_each_kind_of_process_is_reported_for_the_no_op_rows() -> None:
    report = Report(header=[], rows=[
        row("ours_1", 1.0, 900, cpu_us={"worker": 512.4, "api": 498.0, "redis": 350.6}),
        row("ours_64", 20.0, 2000, clients=64, cpu_us={"worker": 1250.0, "api": 250.2, "redis": 155.0}),
        row("bare_64", 5.0, 10000, clients=64, cpu_us={"uvicorn": 99.0}),
    ])
    assert report.cpu_per_call().splitlines()[2:] == [
        "- ours_1, 1 client: worker 512, api 498, redis 351",
        "- ours_64, 64 clients: worker 1,250, api 250, redis 155",
    ]


def due(**changes: object) -> DueResult:
    fields: dict[str, object] = dict(
        jobs=10_000, connections=64, create_seconds=4.0, slack_ms=3_000, all_started_ms=5_000, all_finished_ms=5_100,
        lateness_p50_ms=2_400, lateness_p99_ms=4_950, early=0, retried=0, not_succeeded=0,
        cpu_us_per_job={"worker": 200.0, "api": 0.2, "redis": 140.0}, plain_rps=2_500.0,
        plain_cpu_us={"worker": 110.0, "api": 120.0, "redis": 80.0})
    fields.update(changes)
    return DueResult(**fields)  # type: ignore[arg-type]


def test_jobs_due_at_once_start_at_a_rate_compared_with_the_same_runs_plain_executions() -> None:
    lines = Report(header=[], jobs_due=due()).jobs_due_lines().splitlines()
    assert "- all started after **5,000 ms** (2,000 starts/s), all finished after 5,100 ms" in lines
    # 2,000 starts/s against 2,500 executions/s on the same processes.
    assert "- started at **0.800×** the rate of plain no-op executions on the same processes (2,500/s at 64 clients)" \
        in lines
    assert "- lateness (first attempt's started_at − run_at): p50 2,400 ms, p99 4,950 ms" in lines
    assert lines[-1].startswith("- CPU per job, run_at to the last finish (µs): worker 200, redis 140; "
                                "per plain execution: worker 110, api 120, redis 80")


def test_without_plain_executions_the_jobs_rows_give_no_ratio() -> None:
    text = Report(header=[], jobs_due=due(plain_rps=None, plain_cpu_us={})).jobs_due_lines()
    assert "rate of plain" not in text
    assert "per plain execution" not in text


def test_redis_memory_per_queued_job_is_the_growth_of_used_memory_over_the_jobs() -> None:
    report = Report(header=[], jobs_memory=MemoryResult(jobs=100_000, used_before=2 * 2**20,
                                                        used_after=2 * 2**20 + 200_000_000, create_seconds=10.0,
                                                        arguments_bytes=73))
    assert "**2,000 bytes**" in report.jobs_memory_lines()
    assert report.render().count("Redis memory per queued job") == 1


def test_a_run_of_sections_only_prints_no_empty_table() -> None:
    report = Report(header=["# h"], jobs_memory=MemoryResult(1, 0, 1000, 1.0, 73))
    assert "| scenario |" not in report.render()


def test_console_pages_are_held_to_a_second_each_at_the_issues_size() -> None:
    from bench.console import ConsoleResult, PageTime

    pages = [PageTime("health", "/health", "/health", 0.8, 1.0, True),
             PageTime("tools", "/console/tools", "/console/tools", 40.0, 60.0, True),
             PageTime("one execution", "/console/executions/exec_x", "/console/executions/{execution_id}", 2.0, 3.0,
                      True)]
    report = Report(header=[], console=ConsoleResult(10_000, 100, 1000, pages))
    assert "| tools (`/console/tools`) | 40.0 | 60.0 |" in report.console_lines()
    assert "| console pages, 10,000 audit entries and 100 workers: p50 ≤ 1,000 ms | 40 ms (tools) | yes |" in (
        report.targets())
    slow = Report(header=[], console=ConsoleResult(10_000, 100, 1000, [*pages[:1], PageTime(
        "jobs", "/console/jobs", "/console/jobs", 1500.0, 1600.0, True)]))
    assert "| 1,500 ms (jobs) | **no** |" in slow.targets()
    broken = Report(header=[], console=ConsoleResult(10_000, 100, 1000, [PageTime(
        "jobs", "/console/jobs", "/console/jobs", 5.0, 6.0, False)]))
    assert "**no**" in broken.targets()


def test_the_cluster_rows_are_compared_with_one_redis_and_the_busiest_primary_is_held_to_its_target() -> None:
    single = row("cluster_single_64", 30.0, 2000, clients=64, cpu_us={"worker": 200.0, "api": 210.0, "redis": 120.0})
    baseline = ClusterPoint(1, row("cluster_p1_64", 32.0, 1800, clients=64, cpu_us={"api": 300.0, "redis": 100.0}),
                            {7001: 0.01, 7002: 0.98, 7003: 0.01},
                            redis_cpu_s=0.9, calls=9000)
    spread = ClusterPoint(16, row("cluster_p16_64", 28.0, 2200, clients=64), {7001: 0.44, 7002: 0.31, 7003: 0.25},
                          redis_cpu_s=1.1, calls=11000)
    lopsided = ClusterPoint(16, row("cluster_p16_64", 28.0, 2200, clients=64), {7001: 0.6, 7002: 0.2, 7003: 0.2})
    report = Report(header=[], cluster_single=single, cluster=[baseline, spread])
    table = report.cluster_lines().splitlines()
    assert table[-4] == "| 1 | 1,800 | 0.900× | 32.000 | 64.000 | 100 | 1% / 98% / 1% |"
    assert table[-3] == "| 16 | 2,200 | 1.1× | 28.000 | 56.000 | 100 | 44% / 31% / 25% |"
    assert table[-1] == ("CPU per call (µs, all processes of a kind together): one Redis: worker 200, api 210, "
                         "redis 120; 1 partition: api 300, redis 100")
    # One partition puts everything on one primary: the baseline, not held to the target.
    assert verdicts(report) == {"Redis Cluster, 16 partitions: no primary over 50% of the Redis CPU": "44% yes"}
    assert verdicts(Report(header=[], cluster_single=single, cluster=[lopsided]))[
        "Redis Cluster, 16 partitions: no primary over 50% of the Redis CPU"] == "60% **no**"


def test_without_the_single_redis_row_there_is_no_cluster_section() -> None:
    point = ClusterPoint(1, row("cluster_p1_64", 32.0, 1800, clients=64))
    assert Report(header=[], cluster=[point]).cluster_lines() == ""


def test_over_rounds_each_ratio_is_the_median_of_each_rounds_ratio_with_its_range() -> None:
    # Round 2 ran on a slower moment for both sides: its ratio is like the others', though
    # its figures are not. The median of the ratios (5.0×) is not the ratio of the medians.
    rounds = [[row("ours_1", 1.0, 900), row("sse_first", 0.6, None), row("bare_1", 0.2, 5000)],
              [row("ours_1", 2.0, 450), row("sse_first", 1.2, None), row("bare_1", 0.5, 2000)],
              [row("ours_1", 1.1, 800), row("sse_first", 0.66, None), row("bare_1", 0.2, 5100)]]
    rows = [median_row([r for rs in rounds for r in rs if r.key == key]) for key in ("ours_1", "sse_first", "bare_1")]
    report = Report(header=[], rows=[*rows, row("traced_1", 1.21, 800)], rounds=rounds)  # tracing's: played once
    got = verdicts(report)
    assert got["no-op, 1 client: p50 ≤ 4× bare Starlette's p50"] == "5.0× (4.0×–5.5×) **no**"
    assert got["no-op, 1 client: SSE time to first event ≤ 3× bare Starlette's p50"] == "3.0× (2.4×–3.3×) yes"
    assert "**5.0×** (1.100 vs 0.200 ms, +0.900 ms; 4.0×–5.5× over 3 rounds)" in report.ratios()
    # A row played once is compared with the median of the other: no round measured both.
    assert "- Carmy tracing on vs off, p50 at 1 client: **1.1×** (1.210 vs 1.100 ms, +0.110 ms)" in report.ratios()


def test_a_rows_median_over_rounds_takes_each_figure_s_median_and_adds_up_errors() -> None:
    rounds = [row("ours_64", 20.0, 3000, clients=64, errors=1, cpu_us={"api": 100.0, "redis": 80.0}),
              row("ours_64", 30.0, 2000, clients=64, cpu_us={"api": 130.0, "redis": 70.0}),
              row("ours_64", 25.0, 2600, clients=64, errors=2, cpu_us={"api": 110.0, "redis": 90.0})]
    got = median_row(rounds)
    assert (got.p50_ms, got.p99_ms, got.rps, got.errors) == (25.0, 50.0, 2600, 3)
    assert got.cpu_us_per_call == {"api": 110.0, "redis": 80.0}


def test_a_run_of_three_rounds_plays_the_ratios_scenarios_first_and_only_them_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    played: list[str] = []
    p50s = {"ours_1": iter([1.0, 2.0, 3.0]), "bare_1": iter([0.2, 0.4, 0.3])}

    def scenario(name: str, key: str) -> scenarios.Scenario:
        def play(b: scenarios.Bench) -> None:
            played.append(name)
            if key:
                b.report.rows.append(row(key, next(p50s[key]), 100.0))
        play.__name__ = name
        return play

    ours, bare, once = scenario("carmy", "ours_1"), scenario("bare", "bare_1"), scenario("floor", "")
    monkeypatch.setattr(scenarios, "ALL", (ours, bare, once))
    monkeypatch.setattr(scenarios, "ROUNDED", (ours, bare))
    report = bench_run.run(scenarios.QUICK, True, [], rounds=3)
    assert played == ["carmy", "bare", "carmy", "bare", "carmy", "bare", "floor"]  # the rounds back to back
    assert [r.p50_ms for r in report.rows] == [2.0, 0.3]  # each row's median
    assert report.spread("ours_1", "bare_1", by_rps=False) == Spread(5.0, 5.0, 10.0, 3)
