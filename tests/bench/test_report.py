"""The benchmark report's checks of the targets (bench/README.md, "Targets") and its CPU per
execution: what a run says was met is what its rows measured."""

from __future__ import annotations

from bench.report import Report, Row, ScalePoint


def row(key: str, p50_ms: float, rps: float | None, *, clients: int = 1, errors: int = 0,
        cpu_us: dict[str, float] | None = None) -> Row:
    return Row(key, key, clients, p50_ms, p50_ms * 2, rps, errors, "", cpu_us or {})


def verdicts(report: Report) -> dict[str, str]:
    """Each target's line in the targets table: name -> (measured, met)."""
    table = report.targets().split("\n\n", 1)[1].splitlines()[2:]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table]
    return {name: f"{measured} {met}" for name, measured, met in cells}


def test_issue_14s_targets_are_checked_as_ratios_to_the_baselines_of_the_same_run() -> None:
    report = Report(header=[], rows=[
        row("ours_1", 1.0, 900), row("sse_first", 1.3, None), row("bare_1", 0.2, 5000),
        row("ours_64", 20.0, 2000, clients=64), row("bare_64", 5.0, 10000, clients=64),
    ], scale=[
        ScalePoint(1, row("scale_1", 800, 288, clients=256), 320),  # 90 %
        ScalePoint(2, row("scale_2", 400, 569, clients=256), 640),  # 88.9 %
        ScalePoint(4, row("scale_4", 200, 1240, clients=256, errors=3), 1280),  # 96.9 %, with errors
    ])
    got = verdicts(report)
    assert got["same, ≥ 0.2× bare Starlette's throughput"] == "0.20× yes"
    assert got["no-op, 1 client: p50 ≤ 6× bare Starlette's p50"] == "5.0× yes"
    assert got["no-op, 1 client: SSE time to first event ≤ 6× bare Starlette's p50"] == "6.5× **no**"
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
