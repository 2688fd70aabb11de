"""``_agent.next_actions``: what an agent can do after a failure, decided once, when the result
body is built, from the error and what is known of the execution (docs/protocol.md, section 4).

A body is built either for a refusal (the API turned the call down and recorded nothing, so the
very same call, ``request_id`` included, may be sent again) or for a record (stored and replayed
byte for byte, so the ``request_id`` is spent: calling again needs a new one). Every surface
(JSON, SSE, polling, replay, MCP's ``_meta``) sends the body's list, so they always agree.
"""

from __future__ import annotations

from carmy_worker.wire import ErrorBody, NextAction

# Codes after which the tool may or may not have acted: the agent must look before it acts again.
_UNKNOWN_EFFECTS = frozenset({"TIMEOUT", "CANCELLED"})


def after_refusal(err: ErrorBody, tool: str) -> list[NextAction]:
    """After a call refused before any worker saw it. ``tool`` is a catalog name (a refusal
    that comes before the tool is found, ``TOOL_NOT_FOUND``, suggests nothing)."""
    if err.code == "CONFIRMATION_REQUIRED":
        return [NextAction(action="retry", tool=tool, same_request_id=True, requires=f"confirm:{tool}")]
    if err.code == "IDEMPOTENCY_CONFLICT":
        return [NextAction(action="retry", tool=tool, same_request_id=False)]
    if err.retryable:  # QUEUE_FULL, RATE_LIMITED, NO_WORKERS...: the same call once retry_after has passed
        return [NextAction(action="retry", tool=tool, same_request_id=True, after_ms=_after_ms(err))]
    return []


def after_record(err: ErrorBody, tool: str, *, rerun_safe: bool) -> list[NextAction]:
    """After a recorded failure. ``rerun_safe``: running the call again cannot repeat an effect
    (the tool never started, or it is idempotent)."""
    if err.code == "EXECUTION_UNCERTAIN":
        return [NextAction(action="reconcile", tool=tool)]
    if err.code in _UNKNOWN_EFFECTS:
        if rerun_safe:
            return [NextAction(action="retry", tool=tool, same_request_id=False)]
        return [NextAction(action="reconcile", tool=tool)]
    if err.retryable:  # a tool's own error that says trying again may work
        return [NextAction(action="retry", tool=tool, same_request_id=False, after_ms=_after_ms(err))]
    return []


def _after_ms(err: ErrorBody) -> int | None:
    return None if err.retry_after is None else err.retry_after * 1000
