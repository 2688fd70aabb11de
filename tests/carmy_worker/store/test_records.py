"""Records built for the caller: the one of last resort is the same as the ordinary one, and
each body carries the ``_agent.next_actions`` docs/protocol.md gives its error code."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from carmy_worker.sdk.errors import ToolError, error, store_unavailable
from carmy_worker.store import records
from carmy_worker.wire import Record

EXEC_ID = "exec_0b9d7c1e-5f3a-4e2b-9c41-7d2a8e6f1b30"
RETRY_NEW_ID = [{"action": "retry", "tool": "t", "same_request_id": False}]
RECONCILE = [{"action": "reconcile", "tool": "t"}]


def actions(record: Record) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = msgspec.json.decode(record.body)["_agent"]["next_actions"]
    return result


def test_the_panic_of_last_resort_is_an_ordinary_tool_panic() -> None:
    assert records.panic(EXEC_ID, "t") == records.failed(EXEC_ID, "t", records.panic_error())


@pytest.mark.parametrize(("record", "expected"), [
    (records.completed(EXEC_ID, "t", b"{}", cacheable=True, duration_ms=1), []),
    (records.panic(EXEC_ID, "t"), []),
    # Never started, or idempotent: running it again repeats nothing, under a new request_id.
    (records.never_started(EXEC_ID, "t"), RETRY_NEW_ID),
    (records.not_restarted(EXEC_ID, "t"), RETRY_NEW_ID),
    (records.abandoned_in_queue(EXEC_ID, "t"), RETRY_NEW_ID),
    (records.cancelled(EXEC_ID, "t", started=False), RETRY_NEW_ID),
    (records.cancelled(EXEC_ID, "t", started=True, idempotent=True), RETRY_NEW_ID),
    (records.timed_out(EXEC_ID, "t", 1, idempotent=True), RETRY_NEW_ID),
    # It may have acted: look first.
    (records.cancelled(EXEC_ID, "t", started=True), RECONCILE),
    (records.timed_out(EXEC_ID, "t", 1), RECONCILE),
    (records.uncertain(EXEC_ID, "t", "its worker stopped"), RECONCILE),
    # A tool's own error: again only if it says so, after its retry_after.
    (records.failed(EXEC_ID, "t", ToolError("BUSY", "busy", retryable=True, retry_after=3).to_wire()),
     [{"action": "retry", "tool": "t", "same_request_id": False, "after_ms": 3000}]),
    (records.failed(EXEC_ID, "t", ToolError("BUSY", "busy", retryable=True).to_wire()), RETRY_NEW_ID),
    (records.failed(EXEC_ID, "t", ToolError("OUT_OF_STOCK", "none", recoverable=True).to_wire()), []),
    (records.failed(EXEC_ID, "t", error("INVALID_ARGUMENTS", "no")), []),
    (records.failed(EXEC_ID, "t", error("TOOL_NOT_FOUND", "no")), []),
])
def test_next_actions_of_records(record: Record, expected: list[dict[str, Any]]) -> None:
    assert actions(record) == expected


@pytest.mark.parametrize(("err", "expected"), [
    # Nothing was recorded: the very same call, request_id included.
    (error("QUEUE_FULL", "busy", retry_after=1),
     [{"action": "retry", "tool": "t", "same_request_id": True, "after_ms": 1000}]),
    (error("NO_WORKERS", "none", retry_after=2),
     [{"action": "retry", "tool": "t", "same_request_id": True, "after_ms": 2000}]),
    (error("RATE_LIMITED", "slow down", retry_after=4),
     [{"action": "retry", "tool": "t", "same_request_id": True, "after_ms": 4000}]),
    (store_unavailable(retry_after=5),
     [{"action": "retry", "tool": "t", "same_request_id": True, "after_ms": 5000}]),
    (error("CONFIRMATION_REQUIRED", "ask"),
     [{"action": "retry", "tool": "t", "same_request_id": True, "requires": "confirm:t"}]),
    (error("IDEMPOTENCY_CONFLICT", "used"), RETRY_NEW_ID),
    (error("INVALID_ID", "bad"), []),
    (error("INVALID_ARGUMENTS", "bad"), []),
    (error("TOOL_NOT_FOUND", "none"), []),
])
def test_next_actions_of_refusals(err: Any, expected: list[dict[str, Any]]) -> None:
    assert actions(records.refused(EXEC_ID, "t", err)) == expected


def test_a_body_without_actions_is_the_same_bytes_as_before() -> None:
    """Old records (and replays of them) and new ones agree when there is nothing to suggest."""
    body = records.failed(EXEC_ID, "t", error("INVALID_ARGUMENTS", "no")).body
    assert body.endswith(b',"_agent":{"cacheable":false,"next_actions":[]}}')
