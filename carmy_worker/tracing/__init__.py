"""Traces across the queue (OpenTelemetry), off by default.

One trace per execution: the API's span for the request (``POST /agent/execute``, or
``tools/call <tool>`` over MCP), then in the worker the time queued (``carmy.queued``, SUBMIT to CLAIM)
and the tool's run (``carmy.run``), both children of the request's span. The job carries the
request span's W3C ``traceparent`` from the API to the worker (``ExecutionJob.traceparent``).

Off (the default), nothing here imports OpenTelemetry and nothing on the hot path makes a span:
the API and the worker hold ``None`` instead of a ``Tracing``. ``start`` imports the SDK only
when ``CARMY_TRACING`` turns traces on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from carmy_worker.settings import TracingSettings
from carmy_worker.tracing.traceparent import trace_id_of, with_trace_id

if TYPE_CHECKING:
    from carmy_worker.tracing.tracer import Tracing

__all__ = ["Tracing", "TracingSettings", "start", "trace_id_of", "with_trace_id"]


def start(settings: TracingSettings, *, service: str) -> Tracing | None:
    """The process's tracer, or None when tracing is off (then OpenTelemetry is never imported).

    ``service`` names the process when ``OTEL_SERVICE_NAME`` does not.
    """
    if settings.mode == "off":
        return None
    from carmy_worker.tracing.tracer import Tracing  # the SDK, only now that it is wanted

    return Tracing(settings, service=service)
