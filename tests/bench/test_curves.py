"""The cost curves' growth exponents (bench/curves.py) and how the report shows them: a figure
that grows faster than its work must be flagged, one that does not must not be."""

from __future__ import annotations

import pytest

from bench.curves import Column, Curve, Point, render, render_all, slope
from bench.report import Report


def test_the_slope_is_the_exponent_of_a_power_law() -> None:
    assert slope([(1, 3.0), (10, 30.0), (100, 300.0)]) == pytest.approx(1.0)
    assert slope([(1_000, 5.0), (10_000, 5.0), (1_000_000, 5.0)]) == pytest.approx(0.0)
    assert slope([(1024, 1.0), (65536, 4096.0)]) == pytest.approx(2.0)


def test_a_size_or_figure_of_zero_is_left_out_of_the_fit_and_one_size_gives_no_slope() -> None:
    assert slope([(0, 1.0), (100, 10.0), (1000, 100.0)]) == pytest.approx(1.0)
    assert slope([(0, 1.0), (100, 10.0)]) is None
    assert slope([(100, 0.0), (1000, 10.0)]) is None


def test_the_slope_is_a_least_squares_fit_over_every_size() -> None:
    # log10 points (0, 0), (1, 1), (2, 3): slope 1.5 by least squares, 2 from the last pair alone.
    assert slope([(1, 1.0), (10, 10.0), (100, 1000.0)]) == pytest.approx(1.5)


def curve() -> Curve:
    return Curve("cost_payload", "Arguments by size", "bytes", [
        Column("p50 ms"), Column("SUBMIT µs", work=0), Column("bare p50 ms", fitted=False)], [
        Point(1024, {"p50 ms": 1.0, "SUBMIT µs": 100.0, "bare p50 ms": 0.05}),
        Point(65536, {"p50 ms": 2.0, "SUBMIT µs": 200.0}),  # bare missing at this size
        Point(1048576, {"p50 ms": 1200.0, "SUBMIT µs": 400.0, "bare p50 ms": 10.0}),
    ])


def test_a_slope_above_the_works_exponent_is_flagged_and_one_at_or_below_it_is_not() -> None:
    flagged = {column.name: round(s, 2) for column, s in curve().flagged()}
    # p50: 1 → 2 → 1200 over 1 KiB → 1 MiB, slope 0.96: no faster than the work (exponent 1).
    # SUBMIT: 100 → 400 over three decades, slope 0.2 against a work that must not grow (0).
    assert flagged == {"SUBMIT µs": 0.2}


def test_the_rendered_curve_has_a_row_per_size_and_each_fitted_columns_slope() -> None:
    lines = render(curve()).splitlines()
    assert lines[2] == "| bytes | p50 ms | SUBMIT µs | bare p50 ms |"
    assert lines[4] == "| 1,024 | 1 | 100 | 0.05 |"
    assert lines[5] == "| 65,536 | 2 | 200 | – |"
    assert lines[6] == "| 1,048,576 | 1,200 | 400 | 10 |"
    assert lines[8] == ("Slope on log-log: p50 ms **0.96**; SUBMIT µs **0.20** (**faster than the work**, "
                        "whose exponent is 0).")
    assert "bare p50 ms **" not in lines[8]  # a baseline's column has no slope of its own


def test_the_report_names_every_curve_growing_faster_than_its_work() -> None:
    text = Report(header=[], curves=[curve()]).render()
    assert "Growing faster than the work: Arguments by size: SUBMIT µs (0.20 > 0 + 0.1)." in text
    steady = Curve("cost_waiting", "Waiting", "items", [Column("LEASE µs", work=0)],
                   [Point(1000, {"LEASE µs": 50.0}), Point(100_000, {"LEASE µs": 52.0})])
    assert render_all([steady]).endswith("No figure grows faster than the work.")
    assert render_all([]) == ""
