"""Latency of single calls made one after another: SSE time to first event and to the end of
the stream. A Python client is fine here: it measures time per call, not calls per second."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class Percentiles:
    count: int
    p50_ms: float
    p99_ms: float


def percentiles(samples_ms: list[float]) -> Percentiles:
    ordered = sorted(samples_ms)
    return Percentiles(count=len(ordered), p50_ms=ordered[len(ordered) // 2],
                       p99_ms=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))])


class StreamProblem(RuntimeError):
    """An SSE call did not end as a completed execution."""


def sse_call(client: httpx.Client, body: dict[str, object]) -> tuple[float, float]:
    """One streamed call: (ms to the first ``event:`` frame, ms to the end of the stream)."""
    start = time.perf_counter()
    first: float | None = None
    text = b""
    with client.stream("POST", "/agent/execute", json=body, headers={"accept": "text/event-stream"}) as response:
        if response.status_code != 200:
            raise StreamProblem(f"SSE call answered {response.status_code}: {response.read()[:300]!r}")
        for chunk in response.iter_raw():
            if first is None and b"event:" in chunk:
                first = time.perf_counter()
            text += chunk
    end = time.perf_counter()
    if first is None or b"event: execution.completed" not in text or b'"status":"completed"' not in text:
        raise StreamProblem(f"SSE stream did not complete: {text[-300:]!r}")
    return (first - start) * 1000, (end - start) * 1000


def sse_latency(base: str, tool: str, calls: int, warmup: int = 20) -> tuple[Percentiles, Percentiles]:
    """Percentiles of time to first event and time to ``execution.completed``, over ``calls``."""
    firsts, totals = [], []
    with httpx.Client(base_url=base, timeout=10) as client:
        for i in range(warmup + calls):
            first, total = sse_call(client, {"tool": tool, "arguments": {}})
            if i >= warmup:
                firsts.append(first)
                totals.append(total)
    return percentiles(firsts), percentiles(totals)
