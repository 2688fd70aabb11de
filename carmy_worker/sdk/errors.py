"""Errors of carmy/1, as data.

The tree of this module:

* ``ErrorCode``: the protocol's codes (docs/protocol.md) with their category.
* ``ToolError``: the one exception a tool raises on purpose; it becomes a ``failed`` result
  carrying exactly its fields.
* ``error(code, ...)``: builds the wire ``ErrorBody`` for a code, with the message and
  flags the protocol prescribes.

Nothing here crosses the queue as an exception: the worker turns every failure into an
``ErrorBody`` before it is recorded, and the API maps categories to HTTP in one place
(``STATUS_BY_CATEGORY``).
"""

from __future__ import annotations

from typing import Any, Final, Literal

from carmy_worker.wire import Category, ErrorBody

STATUS_BY_CATEGORY: Final[dict[str, int]] = {
    "validation": 400,
    "permission": 403,
    "not_found": 404,
    "cancelled": 408,
    "conflict": 409,
    "internal": 500,
    "capacity": 503,
    "timeout": 504,
}

# Codes whose HTTP status is not the one of their category.
STATUS_BY_CODE: Final[dict[str, int]] = {
    "PAYLOAD_TOO_LARGE": 413, "UNAUTHENTICATED": 401, "BODY_TIMEOUT": 408, "UNSUPPORTED_MEDIA_TYPE": 415,
    "RATE_LIMITED": 429, "WEBHOOK_UNAUTHORIZED": 401,
    # An OpenAPI import's upstream (carmy_worker.openapi.failures): its rate limit is the caller's
    # to respect, as RATE_LIMITED is; an answer it cannot pass on is a bad gateway's.
    "UPSTREAM_RATE_LIMITED": 429, "UPSTREAM_ERROR": 502,
}

MAY_HAVE_COMMITTED = "External effects of the tool may have committed."

ErrorCode = Literal[
    "INVALID_REQUEST",
    "PAYLOAD_TOO_LARGE",
    "BODY_TIMEOUT",
    "UNSUPPORTED_MEDIA_TYPE",
    "HOST_NOT_ALLOWED",
    "ORIGIN_NOT_ALLOWED",
    "INVALID_ID",
    "TOOL_NOT_FOUND",
    "INVALID_ARGUMENTS",
    "INVALID_OUTPUT",
    "CONFIRMATION_REQUIRED",
    "UNAUTHENTICATED",
    "INSUFFICIENT_SCOPE",
    "AUTH_UNAVAILABLE",
    "IDEMPOTENCY_CONFLICT",
    "EXECUTION_UNCERTAIN",
    "EXECUTION_NOT_FOUND",
    "TIMEOUT",
    "CANCELLED",
    "TOOL_PANIC",
    "QUEUE_FULL",
    "RATE_LIMITED",
    "NO_WORKERS",
    "STORE_UNAVAILABLE",
    "STORE_FULL",
    "SERVER_STOPPING",
    "JOB_NOT_FOUND",
    "JOB_NOT_RETRYABLE",
    "JOB_NOT_FINISHED",
    "OPERATOR_REQUIRED",
    "WEBHOOK_UNAUTHORIZED",
    "WEBHOOK_NOT_FOUND",
    "UPSTREAM_RATE_LIMITED",
    "UPSTREAM_UNAVAILABLE",
    "UPSTREAM_NOT_FOUND",
    "UPSTREAM_REJECTED",
    "UPSTREAM_FORBIDDEN",
    "UPSTREAM_CONFLICT",
    "UPSTREAM_ERROR",
]

CATEGORY: Final[dict[str, Category]] = {
    "INVALID_REQUEST": "validation",
    "PAYLOAD_TOO_LARGE": "capacity",
    "BODY_TIMEOUT": "timeout",
    "UNSUPPORTED_MEDIA_TYPE": "validation",
    "HOST_NOT_ALLOWED": "permission",
    "ORIGIN_NOT_ALLOWED": "permission",
    "INVALID_ID": "validation",
    "TOOL_NOT_FOUND": "not_found",
    "INVALID_ARGUMENTS": "validation",
    "INVALID_OUTPUT": "internal",
    "CONFIRMATION_REQUIRED": "permission",
    "UNAUTHENTICATED": "permission",
    "INSUFFICIENT_SCOPE": "permission",
    "AUTH_UNAVAILABLE": "capacity",
    "IDEMPOTENCY_CONFLICT": "conflict",
    "EXECUTION_UNCERTAIN": "conflict",
    "EXECUTION_NOT_FOUND": "not_found",
    "TIMEOUT": "timeout",
    "CANCELLED": "cancelled",
    "TOOL_PANIC": "internal",
    "QUEUE_FULL": "capacity",
    "RATE_LIMITED": "capacity",
    "NO_WORKERS": "capacity",
    "STORE_UNAVAILABLE": "capacity",
    "STORE_FULL": "capacity",
    "SERVER_STOPPING": "capacity",
    "JOB_NOT_FOUND": "not_found",
    "JOB_NOT_RETRYABLE": "conflict",
    "JOB_NOT_FINISHED": "conflict",
    "OPERATOR_REQUIRED": "permission",
    "WEBHOOK_UNAUTHORIZED": "permission",
    "WEBHOOK_NOT_FOUND": "not_found",
    "UPSTREAM_RATE_LIMITED": "capacity",
    "UPSTREAM_UNAVAILABLE": "capacity",
    "UPSTREAM_NOT_FOUND": "not_found",
    "UPSTREAM_REJECTED": "validation",
    "UPSTREAM_FORBIDDEN": "permission",
    "UPSTREAM_CONFLICT": "conflict",
    "UPSTREAM_ERROR": "internal",
}

# Codes an agent may simply try again (after ``retry_after`` when given).
RETRYABLE: Final[frozenset[str]] = frozenset({
    "QUEUE_FULL", "RATE_LIMITED", "NO_WORKERS", "STORE_UNAVAILABLE", "STORE_FULL", "SERVER_STOPPING",
    "AUTH_UNAVAILABLE", "UPSTREAM_RATE_LIMITED", "UPSTREAM_UNAVAILABLE",
})
# Codes an agent can recover from by changing something (its request, or waiting).
RECOVERABLE: Final[frozenset[str]] = RETRYABLE | {
    "INVALID_REQUEST",
    "PAYLOAD_TOO_LARGE",
    "BODY_TIMEOUT",
    "UNSUPPORTED_MEDIA_TYPE",
    "INVALID_ID",
    "INVALID_ARGUMENTS",
    "CONFIRMATION_REQUIRED",
    "OPERATOR_REQUIRED",
    "JOB_NOT_FINISHED",
    "UNAUTHENTICATED",
    "WEBHOOK_UNAUTHORIZED",
    "INSUFFICIENT_SCOPE",
    "IDEMPOTENCY_CONFLICT",
    "EXECUTION_UNCERTAIN",
    "TIMEOUT",
    "CANCELLED",
    "UPSTREAM_NOT_FOUND",
    "UPSTREAM_REJECTED",
    "UPSTREAM_CONFLICT",
}


def error(
    code: ErrorCode,
    message: str,
    *,
    retry_after: int | None = None,
    suggested_action: str | None = None,
    details: Any = None,
) -> ErrorBody:
    """The wire error for one of the protocol's own codes."""
    return ErrorBody(
        code=code,
        message=message,
        category=CATEGORY[code],
        recoverable=code in RECOVERABLE,
        retryable=code in RETRYABLE,
        retry_after=retry_after,
        suggested_action=suggested_action,
        details=details,
    )


ECHO_LIMIT = 256  # characters of a caller's value an error message, its details or a log line may repeat


def clip(value: object, limit: int = ECHO_LIMIT) -> str:
    """``value`` as text, cut to ``limit`` characters with a mark saying so: for anything a caller
    sent that an answer or a log line repeats, so that no input is amplified."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…(cut, {len(text)} characters)"


def store_unavailable(message: str = "The execution store cannot be reached.", *, retry_after: int = 1) -> ErrorBody:
    """Redis cannot be reached: the call may be retried (with its request_id) once it is back."""
    return error("STORE_UNAVAILABLE", message, retry_after=retry_after)


def store_full(retry_after: int = 5) -> ErrorBody:
    """Redis is out of memory for new work (at its maxmemory, less the headroom kept for the work
    already accepted): nothing was recorded; the call may be retried once memory frees."""
    return error("STORE_FULL", "The execution store (Redis) is out of memory: new calls are refused until "
                 "memory frees. Nothing was recorded; retry later with the same request_id.", retry_after=retry_after)


def server_stopping(exec_id: str) -> ErrorBody:
    """This API process is stopping and can wait no longer for an execution's outcome (the end of
    its grace, ``api.serving.stopping``): the execution goes on, and its outcome is read again."""
    return error("SERVER_STOPPING", "This API process is stopping and could wait no longer for the outcome; the "
                 "execution goes on. Retry with the same request_id to get its outcome, or GET "
                 f"/agent/executions/{exec_id}.", retry_after=1)


def http_status(err: ErrorBody) -> int:
    """The HTTP status that carries ``err`` (the body stays authoritative)."""
    return STATUS_BY_CODE.get(err.code) or STATUS_BY_CATEGORY.get(err.category, 500)


class ToolError(Exception):
    """Raised by a tool to fail with a structured, agent-readable error.

    The result is ``failed`` and carries exactly these fields. ``retryable`` implies
    ``recoverable``; ``retry_after`` is in whole seconds.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        category: Category = "internal",
        recoverable: bool = False,
        retryable: bool = False,
        retry_after: int | None = None,
        suggested_action: str | None = None,
        details: Any = None,
    ) -> None:
        if category not in STATUS_BY_CATEGORY:
            raise ValueError(f"unknown error category {category!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.category = category
        self.retryable = retryable
        self.recoverable = recoverable or retryable
        self.retry_after = retry_after
        self.suggested_action = suggested_action
        self.details = details

    def to_wire(self) -> ErrorBody:
        return ErrorBody(
            code=self.code,
            message=self.message,
            category=self.category,
            recoverable=self.recoverable,
            retryable=self.retryable,
            retry_after=self.retry_after,
            suggested_action=self.suggested_action,
            details=self.details,
        )


def describe(exc: BaseException) -> str:
    """``exc`` as one line of text for a log line or a tool author, even when its ``__str__``
    raises (a tool's exception may be anything)."""
    try:
        text = str(exc)
    except Exception:
        text = "(its text cannot be read)"
    name = type(exc).__name__
    return clip(f"{name}: {text}" if text else name, 1024)
