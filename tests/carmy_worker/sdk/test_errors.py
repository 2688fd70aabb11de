"""Errors as data: the protocol's codes (docs/protocol.md, "Error codes"), ToolError, and the HTTP status of each."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from carmy_worker import ToolError
from carmy_worker.sdk.errors import CATEGORY, error, http_status
from carmy_worker.wire import ErrorBody

# docs/protocol.md's table of error codes, written out independently of the implementation:
# code -> (category, status, retryable, recoverable).
TABLE: dict[str, tuple[str, int, bool, bool]] = {
    "INVALID_REQUEST": ("validation", 400, False, True),
    "PAYLOAD_TOO_LARGE": ("capacity", 413, False, True),
    "BODY_TIMEOUT": ("timeout", 408, False, True),
    "UNSUPPORTED_MEDIA_TYPE": ("validation", 415, False, True),
    "HOST_NOT_ALLOWED": ("permission", 403, False, False),
    "ORIGIN_NOT_ALLOWED": ("permission", 403, False, False),
    "INVALID_ID": ("validation", 400, False, True),
    "TOOL_NOT_FOUND": ("not_found", 404, False, False),
    "INVALID_ARGUMENTS": ("validation", 400, False, True),
    "INVALID_OUTPUT": ("internal", 500, False, False),
    "CONFIRMATION_REQUIRED": ("permission", 403, False, True),
    "UNAUTHENTICATED": ("permission", 401, False, True),
    "INSUFFICIENT_SCOPE": ("permission", 403, False, True),
    "AUTH_UNAVAILABLE": ("capacity", 503, True, True),
    "IDEMPOTENCY_CONFLICT": ("conflict", 409, False, True),
    "EXECUTION_UNCERTAIN": ("conflict", 409, False, True),
    "EXECUTION_NOT_FOUND": ("not_found", 404, False, False),
    "TIMEOUT": ("timeout", 504, False, True),
    "CANCELLED": ("cancelled", 408, False, True),
    "TOOL_PANIC": ("internal", 500, False, False),
    "QUEUE_FULL": ("capacity", 503, True, True),
    "RATE_LIMITED": ("capacity", 429, True, True),
    "NO_WORKERS": ("capacity", 503, True, True),
    "STORE_UNAVAILABLE": ("capacity", 503, True, True),
    "STORE_FULL": ("capacity", 503, True, True),
    "SERVER_STOPPING": ("capacity", 503, True, True),
    "JOB_NOT_FOUND": ("not_found", 404, False, False),
    "JOB_NOT_RETRYABLE": ("conflict", 409, False, False),
    "JOB_NOT_FINISHED": ("conflict", 409, False, True),
    "OPERATOR_REQUIRED": ("permission", 403, False, True),
    "WEBHOOK_UNAUTHORIZED": ("permission", 401, False, True),
    "WEBHOOK_NOT_FOUND": ("not_found", 404, False, False),
    "UPSTREAM_RATE_LIMITED": ("capacity", 429, True, True),
    "UPSTREAM_UNAVAILABLE": ("capacity", 503, True, True),
    "UPSTREAM_NOT_FOUND": ("not_found", 404, False, True),
    "UPSTREAM_REJECTED": ("validation", 400, False, True),
    "UPSTREAM_FORBIDDEN": ("permission", 403, False, False),
    "UPSTREAM_CONFLICT": ("conflict", 409, False, True),
    "UPSTREAM_ERROR": ("internal", 502, False, False),
}

STATUS_OF_CATEGORY = {
    "validation": 400, "permission": 403, "not_found": 404, "cancelled": 408,
    "conflict": 409, "internal": 500, "capacity": 503, "timeout": 504,
}


def test_every_code_is_known() -> None:
    assert set(CATEGORY) == set(TABLE)


@pytest.mark.parametrize("code", sorted(TABLE))
def test_protocol_code(code: Any) -> None:
    category, status, retryable, recoverable = TABLE[code]
    err = error(code, "message")
    assert err.category == category
    assert http_status(err) == status
    assert err.retryable is retryable
    assert err.recoverable is recoverable
    if err.retryable:
        assert err.recoverable


def test_the_documented_flags_are_the_implemented_ones() -> None:
    """docs/protocol.md, section 10: each code's retryable and recoverable columns."""
    text = (Path(__file__).parents[3] / "docs" / "protocol.md").read_text()
    rows = re.findall(r"^\| `([A-Z_]+)` \| \w+ \| \d+ \| (yes|no) \| (yes|no) \|", text, re.MULTILINE)
    assert {code for code, _, _ in rows} == set(TABLE)
    for code, retryable, recoverable in rows:
        assert (TABLE[code][2], TABLE[code][3]) == (retryable == "yes", recoverable == "yes"), code


def test_special_statuses() -> None:
    assert http_status(error("PAYLOAD_TOO_LARGE", "too big")) == 413
    assert http_status(error("UNAUTHENTICATED", "who are you")) == 401
    assert http_status(error("BODY_TIMEOUT", "too slow")) == 408
    assert http_status(error("UNSUPPORTED_MEDIA_TYPE", "send JSON")) == 415
    assert http_status(error("RATE_LIMITED", "slow down")) == 429


def test_internal_codes_are_not_recoverable() -> None:
    assert not error("TOOL_PANIC", "x").recoverable
    assert not error("INVALID_OUTPUT", "x").recoverable
    assert error("INVALID_ARGUMENTS", "x").recoverable


@pytest.mark.parametrize(("category", "status"), sorted(STATUS_OF_CATEGORY.items()))
def test_tool_error_status_follows_its_category(category: Any, status: int) -> None:
    assert http_status(ToolError("OUT_OF_STOCK", "none left", category=category).to_wire()) == status


def test_error_carries_optional_fields() -> None:
    err = error("QUEUE_FULL", "busy", retry_after=3, suggested_action="retry", details={"pending": 9})
    assert (err.retry_after, err.suggested_action, err.details) == (3, "retry", {"pending": 9})
    assert msgspec.json.decode(msgspec.json.encode(err)) == {
        "code": "QUEUE_FULL", "message": "busy", "category": "capacity", "recoverable": True,
        "retryable": True, "retry_after": 3, "suggested_action": "retry", "details": {"pending": 9},
    }


def test_tool_error_defaults() -> None:
    exc = ToolError("NOPE", "Not allowed.")
    assert str(exc) == "Not allowed."
    body = exc.to_wire()
    # Absent fields are omitted; recoverable and retryable are always present.
    assert msgspec.json.decode(msgspec.json.encode(body)) == {
        "code": "NOPE", "message": "Not allowed.", "category": "internal",
        "recoverable": False, "retryable": False,
    }


def test_tool_error_carries_exactly_its_fields() -> None:
    body = ToolError("OUT_OF_STOCK", "Nothing left.", category="conflict", recoverable=True, retry_after=7,
                     suggested_action="wait", details={"sku": "KB-01"}).to_wire()
    assert body == ErrorBody(code="OUT_OF_STOCK", message="Nothing left.", category="conflict", recoverable=True,
                             retryable=False, retry_after=7, suggested_action="wait", details={"sku": "KB-01"})


def test_retryable_implies_recoverable() -> None:
    exc = ToolError("BUSY", "Try later.", category="capacity", retryable=True, recoverable=False)
    assert exc.retryable and exc.recoverable
    assert exc.to_wire().recoverable is True


@pytest.mark.parametrize("category", ["bogus", "Internal", "", None])
def test_unknown_category_is_refused(category: Any) -> None:
    with pytest.raises(ValueError, match="unknown error category"):
        ToolError("X", "y", category=category)


def test_clip_keeps_short_values_and_marks_cut_ones() -> None:
    from carmy_worker.sdk.errors import ECHO_LIMIT, clip

    assert clip("search_products") == "search_products"
    cut = clip("x" * 500_000)
    assert cut.startswith("x" * ECHO_LIMIT) and cut.endswith("…(cut, 500000 characters)")
    assert len(cut) < ECHO_LIMIT + 40
    assert clip({"a": 1}) == "{'a': 1}"
