"""``CARMY_TRACING=file:<path>``: each span as one JSON object a line, appended to a file.

For tests and for a look without a collector; a batch is written with one ``write`` to a file
opened for appending, so processes that share the file do not interleave their lines.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import msgspec
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class SpanLine(msgspec.Struct, omit_defaults=True):
    """One span as written: ids in lowercase hex, as in a ``traceparent``; times in unix ns."""

    name: str
    trace_id: str
    span_id: str
    service: str
    kind: str
    start_ns: int
    end_ns: int
    parent_span_id: str | None = None
    attributes: dict[str, object] = {}


def line(span: ReadableSpan) -> SpanLine:
    ctx = span.get_span_context()
    assert ctx is not None
    return SpanLine(
        name=span.name, trace_id=f"{ctx.trace_id:032x}", span_id=f"{ctx.span_id:016x}",
        service=str(span.resource.attributes.get("service.name", "")), kind=span.kind.name,
        start_ns=span.start_time or 0, end_ns=span.end_time or 0,
        parent_span_id=None if span.parent is None else f"{span.parent.span_id:016x}",
        attributes=dict(span.attributes or {}),
    )


class JsonLinesExporter(SpanExporter):  # type: ignore[misc,unused-ignore]  # untyped in some SDK installs
    """Writes through a raw fd, one ``write`` a batch. The fd is closed under a lock, and a batch
    exported after that (an export that outlived the processor's shutdown) is dropped: a number
    the kernel may already have given to another file or socket is never written to."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._encoder = msgspec.json.Encoder()
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = b"".join(self._encoder.encode(line(span)) + b"\n" for span in spans)
        with self._lock:
            if self._fd < 0:
                return SpanExportResult.FAILURE
            try:
                os.write(self._fd, data)
            except OSError:
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
