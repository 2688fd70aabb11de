"""What every call must pass before it reaches a worker, whichever door it came in by
(``POST /agent/execute`` or MCP's ``tools/call``), in this order: the tool exists, its policy
allows the caller, the request id is valid, the arguments match its input schema, and Redis
admits it. The order is the reference implementation's, and puts first what the agent must
settle first (a call to a tool that does not exist, or that a person must confirm, cannot
succeed whatever its id or arguments). A refusal is data (``Rejected`` carries the error), and
repeats at most ``ECHO_LIMIT`` characters of any value the caller sent."""

from __future__ import annotations

from typing import Any

import jsonschema_rs
import msgspec

from api.calling.catalog import CatalogTool
from carmy_worker.sdk.context import AgentContext
from carmy_worker.sdk.errors import ECHO_LIMIT, clip, error
from carmy_worker.store.submit import Submission
from carmy_worker.wire import ErrorBody

MAX_ID_BYTES = 256
MAX_REASON = 4 * ECHO_LIMIT  # a reason whose quoted names are cut; any longer is cut as a whole


class Rejected(Exception):
    """A call refused after its envelope was decoded (answered with a full result body)."""

    def __init__(self, err: ErrorBody) -> None:
        self.error = err



def check_request_id(request_id: object, *, field: str = "request_id") -> str | None:
    """The request id, if it is one: ``None``, or 1 to ``MAX_ID_BYTES`` bytes of UTF-8 (MCP's
    ``_meta`` may hold any JSON value, hence ``object``; ``field`` names it in the message)."""
    if request_id is None:
        return None
    if not isinstance(request_id, str):
        raise Rejected(error("INVALID_ID", f"{field} must be a string of 1 to {MAX_ID_BYTES} bytes of UTF-8."))
    try:
        size = len(request_id.encode())
    except UnicodeEncodeError:
        size = 0
    if not 1 <= size <= MAX_ID_BYTES:
        raise Rejected(error("INVALID_ID", f"{field} must be 1 to {MAX_ID_BYTES} bytes of UTF-8."))
    return request_id


def check_policy(tool: CatalogTool, agent: AgentContext) -> None:
    spec = tool.spec
    if (spec.effect == "destructive" or spec.confirmation == "required") \
            and f"confirm:{spec.name}" not in agent.permissions:
        raise Rejected(error(
            "CONFIRMATION_REQUIRED",
            f"{spec.name} needs confirmation: the caller's context must grant confirm:{spec.name}.",
            suggested_action="ask the user to confirm, then call again with that permission",
        ))


def check_arguments(tool: CatalogTool, arguments: object) -> dict[str, Any]:
    """The arguments, once they match the tool's input schema, which is always an object schema:
    so a value that is not an object (``null`` included) is refused here, at ``$``. Valid ones
    are checked once; refused ones again, for their first problem (``api.calling.schemas``)."""
    if tool.validator is None:
        raise Rejected(error("INVALID_ARGUMENTS", f"The input schema of {tool.spec.name} cannot be used; "
                                                  "no arguments can be checked against it."))
    if not tool.validator.is_valid(arguments):
        problem = tool.validator.locate(arguments)
        if problem is None:  # a schema whose problems cannot be located in bounded time
            path, reason = "$", "the arguments are not valid under the input schema"
        else:
            path = clip("$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in problem.instance_path))
            reason = _reason(problem)
        raise Rejected(error(
            "INVALID_ARGUMENTS", f"The arguments do not match the input schema at {path}: {reason}",
            details={"path": path, "reason": reason},
        ))
    if not isinstance(arguments, dict):  # pragma: no cover - every input schema is an object schema
        raise Rejected(error("INVALID_ARGUMENTS", "The arguments must be a JSON object.",
                             details={"path": "$", "reason": "not an object"}))
    return arguments


def _reason(problem: jsonschema_rs.ValidationError) -> str:
    """The validator's message, which quotes the offending value whole, with that value cut, so
    that the part saying what is wrong ("… is not of type "integer"") survives."""
    message = problem.message
    if len(message) <= ECHO_LIMIT:
        return message
    value = problem.instance
    quoted = msgspec.json.encode(value).decode()  # compact JSON, as the validator quotes it
    before, found, after = message.partition(quoted)
    if found and len(before) + len(after) <= ECHO_LIMIT:
        cut = msgspec.json.encode(clip(value)).decode() if isinstance(value, str) else clip(quoted)
        return before + cut + after
    if isinstance(value, dict):  # an unexpected name: cut the name, not what is said of it
        for name in [k for k in value if len(k) > ECHO_LIMIT and k in message]:
            message = message.replace(name, clip(name))
        if len(message) <= MAX_REASON:
            return message
    return clip(message)  # a value quoted otherwise


def refusal(sub: Submission, name: str) -> ErrorBody:
    """The error of a submission Redis did not accept (conflict, quota, queue full, no workers)."""
    if sub.kind == "conflict":
        return error(
            "IDEMPOTENCY_CONFLICT",
            "This request_id was already used with another tool or other arguments.",
            suggested_action="use a new request_id for a different call",
            details={"execution_id": sub.execution_id},
        )
    if sub.kind == "limited":
        return rate_limited(sub)
    if sub.kind == "full":
        return error("QUEUE_FULL", f"Too many executions in progress ({sub.pending}); try again shortly.",
                     retry_after=1)
    return error("NO_WORKERS", f"No live worker serves {name} right now.", retry_after=2)


def rate_limited(sub: Submission) -> ErrorBody:
    """The caller's own quota refused it: ``retry_after`` is when it would be admitted again (the
    rate's bucket), in whole seconds rounded up; a pending limit frees when one of its executions
    ends, which nobody can foretell: 1 s, as ``QUEUE_FULL``."""
    retry_after = max(1, -(-sub.retry_after_ms // 1000))
    if sub.limit == "pending":
        message = f"This caller already has {sub.pending} executions in progress, its limit; try again shortly."
    else:
        message = f"This caller is starting executions faster than its rate allows; try again in {retry_after} s."
    return error("RATE_LIMITED", message, retry_after=retry_after, details={"limit": sub.limit})
