"""Building final records: the result body exactly as callers will see it, once and for all."""

from __future__ import annotations

import msgspec

from carmy_worker.sdk.errors import MAY_HAVE_COMMITTED, error, http_status
from carmy_worker.store import next_actions
from carmy_worker.wire import (
    AgentHints,
    ErrorBody,
    NextAction,
    Record,
    ResultBody,
    Status,
    ToolSpec,
    json_encoder,
)

_STATUS_BY_CODE: dict[str, Status] = {"TIMEOUT": "timed_out", "CANCELLED": "cancelled"}
_NO_HINTS = AgentHints(cacheable=False, next_actions=[])


def is_cacheable(spec: ToolSpec) -> bool:
    """A successful result of this tool can be reused by the agent."""
    return spec.idempotent and spec.effect in ("none", "read")


def completed(exec_id: str, tool: str, data_json: bytes, *, cacheable: bool, duration_ms: int | None) -> Record:
    """The record of a success; ``data_json`` is the already validated output as JSON."""
    body = ResultBody(
        execution_id=exec_id, status="completed", data=msgspec.Raw(data_json),
        agent=AgentHints(cacheable=cacheable, next_actions=[]),
    )
    return Record(
        status_code=200, body=json_encoder.encode(body), tool=tool, status="completed", duration_ms=duration_ms
    )


def failed(exec_id: str, tool: str, err: ErrorBody, *, duration_ms: int | None = None,
           rerun_safe: bool = False) -> Record:
    """The record of any failure; the status (failed, timed_out, cancelled) follows the code.

    ``rerun_safe``: running the call again cannot repeat an effect (the tool never started, or
    it is idempotent), which decides what ``next_actions`` suggests after a timeout or a
    cancellation."""
    return _failure(exec_id, tool, err, next_actions.after_record(err, tool, rerun_safe=rerun_safe), duration_ms)


def refused(exec_id: str, tool: str, err: ErrorBody) -> Record:
    """The body of a call refused before any worker saw it: sent once, never stored, so its
    ``next_actions`` may suggest sending the same call, ``request_id`` included, again."""
    return _failure(exec_id, tool, err, next_actions.after_refusal(err, tool), None)


def _failure(exec_id: str, tool: str, err: ErrorBody, actions: list[NextAction], duration_ms: int | None) -> Record:
    status = _STATUS_BY_CODE.get(err.code, "failed")
    hints = AgentHints(cacheable=False, next_actions=actions) if actions else _NO_HINTS
    body = ResultBody(execution_id=exec_id, status=status, error=err, agent=hints)
    return Record(
        status_code=http_status(err), body=json_encoder.encode(body), tool=tool, status=status,
        error_code=err.code, retry_after=err.retry_after, duration_ms=duration_ms,
    )


def panic_error() -> ErrorBody:
    """A tool failed in a way it did not mean to: its text goes to the log, never to the caller."""
    return error("TOOL_PANIC", f"The tool failed with an unexpected error. {MAY_HAVE_COMMITTED}")


# The parts of the record of last resort, encoded once at import.
_PANIC_ERROR = json_encoder.encode(panic_error())
_PANIC_HINTS = json_encoder.encode(_NO_HINTS)


def panic(exec_id: str, tool: str) -> Record:
    """The ``TOOL_PANIC`` record of last resort, for when building the real record failed: made
    of constant parts and the execution id, so that it cannot fail to build. The same bytes as
    ``failed(exec_id, tool, panic_error())``."""
    body = (b'{"execution_id":' + json_encoder.encode(exec_id) + b',"status":"failed","error":' + _PANIC_ERROR
            + b',"_agent":' + _PANIC_HINTS + b"}")
    return Record(status_code=500, body=body, tool=tool, status="failed", error_code="TOOL_PANIC")


def uncertain(exec_id: str, tool: str, why: str) -> Record:
    return failed(exec_id, tool, error(
        "EXECUTION_UNCERTAIN",
        f"The execution was interrupted ({why}) before its result was recorded: its effects may or "
        "may not have happened. Check the state it would have changed before calling again.",
        suggested_action="reconcile",
    ))


def timed_out(exec_id: str, tool: str, seconds: float, *, idempotent: bool = False,
              duration_ms: int | None = None) -> Record:
    """The tool ran past its timeout: run it again only if it is ``idempotent``, else look first."""
    return failed(exec_id, tool, error(
        "TIMEOUT", f"The tool ran past its timeout of {seconds:g} s. {MAY_HAVE_COMMITTED}",
    ), duration_ms=duration_ms, rerun_safe=idempotent)


def never_started(exec_id: str, tool: str) -> Record:
    return failed(exec_id, tool, error(
        "TIMEOUT", "The execution waited in the queue past its start deadline and never ran.",
    ), rerun_safe=True)


def not_restarted(exec_id: str, tool: str) -> Record:
    """An execution put back in the queue when its worker stopped (REAP: only one that may run
    again is) that no worker started again within its start window, counted from then."""
    return failed(exec_id, tool, error(
        "TIMEOUT", "The execution's worker stopped before it finished; it was put back in the queue, and no "
        "worker started it again before its start deadline.",
    ), rerun_safe=True)


def abandoned_in_queue(exec_id: str, tool: str) -> Record:
    """A queued execution whose workers are all gone (a deploy replaced their tool definitions):
    nothing will take it from its queue. Only what may run again waits there (REAP settles the
    rest), so it is safe to run again, under the definitions served now."""
    return failed(exec_id, tool, error(
        "TIMEOUT", "The execution waited in the queue for tool definitions that no worker serves any "
        "more (a deploy replaced them), and did not run again.",
    ), rerun_safe=True)


def cancelled(exec_id: str, tool: str, *, started: bool, idempotent: bool = False,
              duration_ms: int | None = None, by_itself: bool = False) -> Record:
    """Cancelled for its caller, who went away or asked (``DELETE``, ``tasks/cancel``, an MCP
    cancellation), or ``by_itself``: the tool raised ``CancelledError`` with no stop asked of
    it; ``started``: the tool had begun (its effects are unknown unless it is ``idempotent``)."""
    tail = MAY_HAVE_COMMITTED if started else "It had not started."
    why = ("the tool raised CancelledError itself, with no stop asked of it" if by_itself
           else "its caller went away or asked for it to stop")
    return failed(exec_id, tool, error("CANCELLED", f"The execution was cancelled: {why}. {tail}"),
                  duration_ms=duration_ms, rerun_safe=idempotent or not started)
