"""W3C ``traceparent`` values and the trace id in a result body, as plain strings and bytes:
no OpenTelemetry import, so the wire types and the record path can use them."""

from __future__ import annotations

import re

# version-traceid-parentid-flags (W3C Trace Context, level 1); version ff is invalid, and ids of
# all zeros too.
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id (32 lowercase hex digits) of a valid ``traceparent``, else None."""
    if not traceparent:
        return None
    match = _TRACEPARENT.match(traceparent.strip())
    if match is None or traceparent.startswith("ff") or match[1] == "0" * 32 or match[2] == "0" * 16:
        return None
    return match[1]


def with_trace_id(body: bytes, trace_id: str) -> bytes:
    """``body`` (a result body, whose last member is ``_agent``) with ``_agent.trace_id`` added.

    Spliced rather than decoded and re-encoded: a result can be a megabyte, and the body is the
    exact bytes every replay sends. Every result body ends with the ``_agent`` object
    (``wire.ResultBody`` encodes its fields in order, ``records.panic`` writes it last), so
    its closing brace is the one before last.
    """
    if not body.endswith(b"}}"):  # pragma: no cover - every body is built so
        return body
    return body[:-2] + b',"trace_id":"' + trace_id.encode() + b'"}}'
