"""What a tool hands back, made fit to record: its output checked against its type and bounded,
the ``ToolError`` it raised made sendable whatever its fields hold.

Neither function raises on anything a tool can put into a value (``Exception`` subclasses at
least; the runner's last resort takes the rest): an execution must end with a record whatever the
tool returned or raised. The limit (``CARMY_MAX_RESULT_BYTES``) is on JSON bytes; nothing is
ever cut to fit, since a cut JSON document is no document.
"""

from __future__ import annotations

import logging
import math
from typing import Any, cast

import msgspec

from carmy_worker.sdk.errors import MAY_HAVE_COMMITTED, STATUS_BY_CATEGORY, ToolError, error
from carmy_worker.sdk.toolbox import Tool
from carmy_worker.store import records
from carmy_worker.wire import Category, ErrorBody, json_encoder

log = logging.getLogger("carmy.worker")

_CUT = "…(cut)"


def output(tool: Tool, value: Any, *, limit: int, exec_id: str) -> bytes | ErrorBody:
    """``value`` as JSON, if ``tool``'s output type allows it and it is at most ``limit`` bytes;
    otherwise an ``INVALID_OUTPUT`` error (the reason goes to the log, not to the caller).

    JSON has no NaN or infinity: like JavaScript's ``JSON.stringify``, they become ``null``, which
    the output type then refuses unless it allows ``None``.
    """
    try:
        data = json_encoder.encode(value)
    except Exception as exc:  # no JSON for it: an unsupported type, a bad key, too deep (RecursionError)
        return _invalid(tool, exec_id, "cannot be encoded as JSON", exc)
    if len(data) > limit:
        log.error("tool %s returned %d bytes of JSON, over the limit of %d (execution %s)",
                  tool.name, len(data), limit, exec_id)
        return error(
            "INVALID_OUTPUT",
            f"The tool's result is {len(data):,} bytes, {len(data) - limit:,} bytes over the limit of "
            f"{limit:,} bytes (CARMY_MAX_RESULT_BYTES). {MAY_HAVE_COMMITTED}",
            details={"size": len(data), "limit": limit},
        )
    try:
        tool.output_decoder.decode(data)
    except Exception as exc:  # ValidationError; RecursionError for a value just short of too deep
        return _invalid(tool, exec_id, "does not match its output type", exc)
    return data


def _invalid(tool: Tool, exec_id: str, problem: str, exc: Exception) -> ErrorBody:
    log.error("tool %s returned a value that %s (execution %s)", tool.name, problem, exec_id, exc_info=exc)
    return error(
        "INVALID_OUTPUT", f"The tool returned a value its output schema does not allow. {MAY_HAVE_COMMITTED}",
    )


def tool_error(exc: ToolError, *, limit: int, tool: str, exec_id: str) -> ErrorBody:
    """The error a tool raised, as the protocol's error object, whatever its fields hold.

    Text fields are made text (``str()``) and cut to ``limit`` bytes. Details that cannot be
    encoded, or are over ``limit`` bytes, are replaced by ``{"omitted": <why>}``: the error
    itself still reaches the caller. A code or message that cannot be made text at all makes
    the error a ``TOOL_PANIC``.
    """
    code, message = _text(exc.code, limit), _text(exc.message, limit)
    if code is None or message is None:
        log.error("tool %s raised a ToolError whose code or message cannot be made text (execution %s)", tool,
                  exec_id, exc_info=exc)
        return records.panic_error()
    recoverable, retryable = _flag(exc.recoverable), _flag(exc.retryable)
    return ErrorBody(
        code=code,
        message=message,
        category=_category(exc.category),
        recoverable=recoverable or retryable,
        retryable=retryable,
        retry_after=_seconds(exc.retry_after),
        suggested_action=None if exc.suggested_action is None else _text(exc.suggested_action, limit),
        details=_details(exc.details, limit, tool, exec_id),
    )


def _text(value: object, limit: int) -> str | None:
    try:
        text = value if isinstance(value, str) else str(value)
        data = text.encode(errors="replace")  # a lone surrogate cannot be sent: it becomes "?"
    except Exception:
        return None
    if len(data) <= limit:
        return data.decode()
    return data[:limit].decode(errors="ignore") + _CUT


def _flag(value: object) -> bool:
    try:
        return bool(value)
    except Exception:
        return False


def _category(value: object) -> Category:
    if isinstance(value, str) and value in STATUS_BY_CATEGORY:
        return cast("Category", value)
    return "internal"


# The longest ``retry_after`` recorded (30 days, as CARMY_JOBS_HORIZON's default): one asked for
# past it is cut to it. A job's retry waits at least that long, so 10^12 s parked it in year
# 36,488 (its run_at no RFC 3339 date), and one past 2^64 could not be recorded at all.
MAX_RETRY_AFTER_S = 30 * 86_400


def _seconds(value: object) -> int | None:
    """``retry_after`` as whole seconds (the protocol's), rounded up and at most
    ``MAX_RETRY_AFTER_S``; None if it is no number."""
    if isinstance(value, float) and math.isfinite(value):
        value = math.ceil(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return min(value, MAX_RETRY_AFTER_S)


def _details(value: Any, limit: int, tool: str, exec_id: str) -> Any:
    """A JSON copy of ``value`` (what the caller will get, whatever happens to the original),
    or a note saying why it was left out."""
    if value is None:
        return None
    try:
        data = json_encoder.encode(value)
        if len(data) <= limit:
            return msgspec.json.decode(data)
        why = f"The error's details are {len(data):,} bytes, over the limit of {limit:,} bytes."
    except Exception as exc:  # the tool's value is not JSON (or is too deep)
        log.error("tool %s raised a ToolError whose details cannot be encoded (execution %s)", tool, exec_id,
                  exc_info=exc)
        why = "The error's details cannot be encoded as JSON."
    else:
        log.error("tool %s raised a ToolError with %d bytes of details, over the limit of %d (execution %s)",
                  tool, len(data), limit, exec_id)
    return {"omitted": why}
