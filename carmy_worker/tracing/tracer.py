"""The tracer of one process, when tracing is on: imported by ``carmy_worker.tracing.start``
only, so that a process with tracing off never loads the SDK."""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from carmy_worker.settings import SettingsError, TracingSettings
from carmy_worker.tracing.jsonl import JsonLinesExporter

Attributes = Mapping[str, str | int | float | bool]


def exporter(settings: TracingSettings) -> SpanExporter:
    if settings.mode == "file":
        return JsonLinesExporter(settings.path)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise SettingsError("CARMY_TRACING=otlp needs the OTLP exporter: "
                            "pip install opentelemetry-exporter-otlp-proto-http "
                            "(in the checkout: pip install -e '.[otlp]')") from None
    otlp: SpanExporter = OTLPSpanExporter()  # endpoint, headers, timeout: the standard OTEL_EXPORTER_OTLP_* variables
    return otlp


class Tracing:
    """Makes this process's spans and exports them in the background (the SDK's batch processor,
    tuned by the standard ``OTEL_BSP_*`` variables); sampling follows ``OTEL_TRACES_SAMPLER``
    (by default: every trace the caller did not mark unsampled)."""

    def __init__(self, settings: TracingSettings, *, service: str) -> None:
        name = os.environ.get("OTEL_SERVICE_NAME") or service
        self._provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
        self._provider.add_span_processor(BatchSpanProcessor(exporter(settings)))
        self._tracer = self._provider.get_tracer("carmy")
        self._propagator = TraceContextTextMapPropagator()

    def _parent(self, traceparent: str | None) -> Context:
        """The context of a W3C ``traceparent``; an empty one (a new trace) if none or invalid."""
        if not traceparent:
            return Context()
        return self._propagator.extract({"traceparent": traceparent})

    def start(self, name: str, traceparent: str | None, attributes: Attributes, *, server: bool = False,
              start_ns: int | None = None) -> Span:
        """A span, child of ``traceparent`` (or the root of a new trace); the caller ends it."""
        span: Span = self._tracer.start_span(name, context=self._parent(traceparent),
                                             kind=SpanKind.SERVER if server else SpanKind.CONSUMER,
                                             attributes=attributes, start_time=start_ns)
        return span

    def interval(self, name: str, traceparent: str | None, attributes: Attributes, start_ns: int,
                 end_ns: int) -> None:
        """A span of a time already past (the time queued, known once the job is claimed)."""
        self._tracer.start_span(name, context=self._parent(traceparent), kind=SpanKind.INTERNAL,
                                attributes=attributes, start_time=start_ns).end(end_ns)

    @staticmethod
    def traceparent(span: Span) -> str:
        """The W3C ``traceparent`` that makes ``span`` the parent of another."""
        ctx = span.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def shutdown(self) -> None:
        """Export what is left; at the end of the process."""
        self._provider.shutdown()

