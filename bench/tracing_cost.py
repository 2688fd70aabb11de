"""``python -m bench.tracing_cost [--n 20000]``: the CPU that tracing adds to one execution, in
process, without HTTP or Redis: what the API and the worker do for its spans, timed alone.

Off, the hot path tests ``tracing is None`` and the ``traceparent`` field of the job (absent);
on, it makes the three spans of an execution (request, queued, run), formats the job's
``traceparent``, reads its trace id and adds it to the result body, with spans exported to
``/dev/null`` by the batch processor's thread. The ``traced`` rows of ``bin/bench`` measure the
same end to end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from carmy_worker import tracing
from carmy_worker.settings import TracingSettings
from carmy_worker.wire import ExecutionJob

BODY = b'{"execution_id":"exec_0b9d7c1e-5f3a-4e2b-9c41-7d2a8e6f1b30","status":"completed","data":{},' \
       b'"_agent":{"cacheable":false,"next_actions":[]}}'


def one_off(t: tracing.Tracing | None, job: ExecutionJob) -> None:
    """What an execution costs the tracing code with tracing off (every check it makes)."""
    if t is not None:  # pragma: no cover - off
        raise AssertionError
    if job.traceparent:  # pragma: no cover - off
        raise AssertionError
    tracing.trace_id_of(job.traceparent)


def one_on(t: tracing.Tracing, incoming: str | None) -> None:
    """The API's span and the worker's two, as the code paths make them."""
    request = t.start("POST /agent/execute", incoming, {"http.request.method": "POST", "url.path": "/agent/execute"},
                      server=True)
    traceparent = t.traceparent(request)
    now = time.time_ns()
    t.interval("carmy.queued", traceparent, {"carmy.execution_id": "e", "carmy.tool": "noop", "carmy.attempt": 1,
                                             "carmy.claim": "run"}, now - 1_000_000, now)
    run = t.start("carmy.run", traceparent, {"carmy.execution_id": "e", "carmy.tool": "noop", "carmy.attempt": 1})
    trace_id = tracing.trace_id_of(traceparent)
    assert trace_id is not None
    run.set_attribute("carmy.outcome", "completed")
    run.end()
    tracing.with_trace_id(BODY, trace_id)
    request.set_attribute("http.response.status_code", 200)
    request.end()


def timed(fn: object, n: int) -> float:
    """µs per call, the best of 3 rounds of ``n``."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            fn()  # type: ignore[operator]
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20000)
    n = parser.parse_args().n
    # The loop makes spans faster than any exporter takes them: queue them all rather than drop some.
    os.environ.setdefault("OTEL_BSP_MAX_QUEUE_SIZE", str(6 * n + 1000))
    job = ExecutionJob(execution_id="e", tool="noop", arguments=b"{}")
    off = tracing.start(TracingSettings(), service="bench")
    print(f"tracing off: {timed(lambda: one_off(off, job), n):.3f} µs per execution; "
          f"OpenTelemetry SDK imported: {'opentelemetry.sdk' in sys.modules}")
    on = tracing.start(TracingSettings("file", "/dev/null"), service="bench")
    assert on is not None
    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    print(f"tracing on, new trace: {timed(lambda: one_on(on, None), n):.1f} µs per execution (3 spans)")
    print(f"tracing on, caller's traceparent: {timed(lambda: one_on(on, caller), n):.1f} µs per execution (3 spans)")
    on.shutdown()


if __name__ == "__main__":
    main()
