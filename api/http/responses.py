"""Responses for rejected envelopes, and the headers every execute answer carries. The
category-to-status mapping lives in ``carmy_worker.sdk.errors``, one place for both packages."""

from __future__ import annotations

from starlette.responses import Response

from carmy_worker.sdk.errors import ErrorCode, error, http_status
from carmy_worker.wire import EnvelopeError, ErrorBody, json_encoder

NO_STORE = {"cache-control": "no-store"}


def envelope_error(code: ErrorCode, message: str, *, reason: str | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    """A rejected envelope (or request): ``{"error": ...}`` alone, no execution."""
    return envelope(error(code, message, details={"reason": reason} if reason else None), headers=headers)


def envelope(err: ErrorBody, *, headers: dict[str, str] | None = None) -> Response:
    """``{"error": ...}`` alone, with its status and its ``retry_after`` as ``Retry-After``."""
    extra = {"retry-after": str(err.retry_after)} if err.retry_after is not None else {}
    return Response(json_encoder.encode(EnvelopeError(err)), http_status(err), {**NO_STORE, **extra, **(headers or {})},
                    media_type="application/json")
