"""Cost curves (issue 35): a figure measured at several sizes of the work, and its growth exponent.

A curve's growth exponent is the slope of log(figure) against log(size), by least squares. A
figure that grows as the work does has the work's exponent: 1 for the time of a call against
the bytes it carries, 0 for the time of one SUBMIT against the length of the queue behind it.
A slope above the work's by more than ``SLACK`` is flagged in the report: that figure grows
faster than what it is asked to do, a bug to fix or a limit to document.

Sizes of 0 (0 progress events) and figures of 0 have no logarithm: they stay in the table and
are left out of the fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# How far above the work's exponent a slope may be before it is flagged: with three sizes on a
# shared machine, a tenth is about the noise of a slope over two decades.
SLACK = 0.1


@dataclass(frozen=True)
class Column:
    """One figure of a curve: its name with its unit, and the exponent of the work it measures."""

    name: str
    work: float = 1.0  # 1: grows as the size does; 0: must not grow with it
    fitted: bool = True  # False: shown beside the others (a baseline's), without a slope of its own


@dataclass(frozen=True)
class Point:
    size: int
    values: dict[str, float]  # column name -> figure; a column missing here is shown as "–"


@dataclass
class Curve:
    key: str  # the scenario that measured it
    title: str  # what the rows measure, for the report's heading
    size: str  # what the size counts, e.g. "bytes each way"
    columns: list[Column]
    points: list[Point] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def slope(self, column: Column) -> float | None:
        return slope([(p.size, p.values[column.name]) for p in self.points if column.name in p.values])

    def flagged(self) -> list[tuple[Column, float]]:
        """The columns whose slope exceeds their work's by more than ``SLACK``."""
        found = []
        for column in self.columns:
            s = self.slope(column) if column.fitted else None
            if s is not None and s > column.work + SLACK:
                found.append((column, s))
        return found


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(y) on log(x) over the points with x, y > 0 (None under two sizes)."""
    logs = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len({x for x, _ in logs}) < 2:
        return None
    mean_x = sum(x for x, _ in logs) / len(logs)
    mean_y = sum(y for _, y in logs) / len(logs)
    spread = sum((x - mean_x) ** 2 for x, _ in logs)
    return sum((x - mean_x) * (y - mean_y) for x, y in logs) / spread


def figure(value: float) -> str:
    """Three significant figures, with thousands separators for the large."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def render(curve: Curve) -> str:
    """The curve as a markdown table, then each fitted column's slope, flagged when too steep."""
    lines = [f"**{curve.title}**", "", "| " + " | ".join([curve.size, *(c.name for c in curve.columns)]) + " |",
             "|" + "--:|" * (len(curve.columns) + 1)]
    for p in curve.points:
        cells = [f"{p.size:,}", *(figure(p.values[c.name]) if c.name in p.values else "–" for c in curve.columns)]
        lines.append("| " + " | ".join(cells) + " |")
    slopes = []
    for column in curve.columns:
        s = curve.slope(column) if column.fitted else None
        if s is None:
            continue
        text = f"{column.name} **{s:.2f}**"
        if s > column.work + SLACK:
            text += f" (**faster than the work**, whose exponent is {column.work:g})"
        slopes.append(text)
    if slopes:
        lines += ["", "Slope on log-log: " + "; ".join(slopes) + "."]
    if curve.notes:
        lines += ["", *curve.notes]
    return "\n".join(lines)


def render_all(curves: list[Curve]) -> str:
    if not curves:
        return ""
    flagged = [f"{c.title}: {col.name} ({s:.2f} > {col.work:g} + {SLACK:g})" for c in curves for col, s in c.flagged()]
    summary = ("Growing faster than the work: " + "; ".join(flagged) + ".") if flagged else \
        "No figure grows faster than the work."
    return "\n\n".join(["Cost curves (issue 35; growth exponents by least squares on log-log):",
                        *(render(c) for c in curves), summary])
