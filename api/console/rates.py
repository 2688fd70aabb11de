"""Rates and quantiles from the counters Redis keeps (``store.metrics``), by difference between
two readings: pure arithmetic, no I/O.

The counters only ever grow, so what happened between two readings is their difference; a
count that went down was reset (a flushed or replaced Redis) and counts from zero again. Each
``Step`` is what happened between two consecutive readings; a ``Window`` sums the last few
steps, so that a tool's rate and its p50/p99 describe the last seconds, not all time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from carmy_worker.store.metrics import BUCKETS_MS, SEP

# The statuses counted as errors: a cancellation is the caller's wish, not a failure.
ERROR_STATUSES = frozenset(("failed", "timed_out"))
N_BUCKETS = len(BUCKETS_MS) + 1  # the last one is +Inf
_SEP = SEP.encode()
_ERROR_STATUSES = frozenset(status.encode() for status in ERROR_STATUSES)


def grown(before: Mapping[bytes, bytes], after: Mapping[bytes, bytes]) -> dict[bytes, int]:
    """The fields of a counters hash that grew from ``before`` to ``after``, by how much. Only
    changed fields are parsed: with a thousand tools, most of them are the same each second."""
    out: dict[bytes, int] = {}
    for name, raw in after.items():
        old = before.get(name)
        if raw == old:
            continue
        new, was = int(raw), int(old) if old is not None else 0
        n = new - was if new >= was else new
        if n:
            out[name] = n
    return out


def quantile(counts: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a histogram of ``BUCKETS_MS`` (non-cumulative counts, the
    last one +Inf), interpolated linearly within its bucket, as Prometheus' histogram_quantile
    does; a quantile in the +Inf bucket is the highest finite edge. None without observations."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    below = 0
    for i, count in enumerate(counts):
        if count and below + count >= rank:
            if i >= len(BUCKETS_MS):
                return float(BUCKETS_MS[-1])
            lower = float(BUCKETS_MS[i - 1]) if i else 0.0
            return lower + (BUCKETS_MS[i] - lower) * (rank - below) / count
        below += count
    return float(BUCKETS_MS[-1])  # q above 1: the top


@dataclass
class ToolStep:
    """One tool's part of a step: executions finished, errors among them, and its run
    durations observed (non-cumulative bucket counts)."""

    finished: int = 0
    errors: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * N_BUCKETS)


@dataclass
class Step:
    """What happened between two readings ``ms`` apart, in total and per tool."""

    ms: int
    finished: int = 0
    errors: int = 0
    tools: dict[str, ToolStep] = field(default_factory=dict)

    @classmethod
    def between(cls, ms: int, executions: Mapping[bytes, int], run: Mapping[bytes, int]) -> Step:
        """From the growth (``grown``) of the executions counters (``tool␟status␟code``) and of the
        run histograms (``tool␟<bucket>``; the ``sum`` fields are left out)."""
        step = cls(ms)
        tools: dict[bytes, ToolStep] = {}  # by the tool's name as stored: decoded once, at the end
        for name, n in executions.items():
            tool, status, _ = name.split(_SEP)
            one = tools.get(tool) or tools.setdefault(tool, ToolStep())
            one.finished += n
            step.finished += n
            if status in _ERROR_STATUSES:
                one.errors += n
                step.errors += n
        for name, n in run.items():
            tool, _, part = name.rpartition(_SEP)
            if part.isdigit() and int(part) < N_BUCKETS:
                (tools.get(tool) or tools.setdefault(tool, ToolStep())).buckets[int(part)] += n
        step.tools = {tool.decode(): one for tool, one in tools.items()}
        return step

    def per_second(self, n: int) -> float:
        return n * 1000 / self.ms if self.ms > 0 else 0.0


class Window:
    """The sum of the last ``size`` steps, per tool: what the per-tool table shows."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.ms = 0
        self.tools: dict[str, ToolStep] = {}
        self._steps: deque[Step] = deque()

    def push(self, step: Step) -> None:
        self._steps.append(step)
        self._add(step, 1)
        if len(self._steps) > self.size:
            self._add(self._steps.popleft(), -1)

    def _add(self, step: Step, sign: int) -> None:
        self.ms += sign * step.ms
        for tool, part in step.tools.items():
            total = self.tools.get(tool)
            if total is None:
                total = self.tools[tool] = ToolStep()
            total.finished += sign * part.finished
            total.errors += sign * part.errors
            for i, n in enumerate(part.buckets):
                total.buckets[i] += sign * n
            if sign < 0 and not total.finished and not any(total.buckets):
                del self.tools[tool]  # quiet for a whole window: no row

    def per_second(self, n: int) -> float:
        return n * 1000 / self.ms if self.ms > 0 else 0.0
