"""An upstream's failure as an error an agent can act on (docs/protocol.md, "Upstream errors").

=============================  ==========================  ===============================
upstream                       code                        the agent
=============================  ==========================  ===============================
429                            ``UPSTREAM_RATE_LIMITED``   retries after ``retry_after``
5xx, no connection             ``UPSTREAM_UNAVAILABLE``    retries (after ``retry_after``)
404                            ``UPSTREAM_NOT_FOUND``      looks for the right thing
400, 422                       ``UPSTREAM_REJECTED``       fixes its arguments
401, 403                       ``UPSTREAM_FORBIDDEN``      stops: an operator's matter
409, 412                       ``UPSTREAM_CONFLICT``       reads the state, then decides
anything else                  ``UPSTREAM_ERROR``          stops
=============================  ==========================  ===============================

The upstream's message is passed on, and its body in ``details.body``, both clipped and with
the worker's credentials blanked out, should the upstream echo them.
"""

from __future__ import annotations

import json
import math
import time
from email.utils import parsedate_to_datetime
from typing import Any

import msgspec

from carmy_worker.sdk.errors import MAY_HAVE_COMMITTED, ErrorCode, ToolError, error
from carmy_worker.wire import is_digits

MAX_MESSAGE = 500  # characters of the upstream's message
MAX_BODY = 2000  # characters of the upstream's body in details
SAFE = ("GET", "HEAD", "OPTIONS")  # methods that change nothing: a failure of theirs committed nothing
_MESSAGE_FIELDS = ("message", "error_description", "detail", "title", "error", "errors", "description")


def retry_after(value: str | None, now: float | None = None) -> int | None:
    """``Retry-After`` (seconds, or an HTTP date) as whole seconds from now, or None."""
    if not value:
        return None
    text = value.strip()
    if is_digits(text):
        return int(text)
    try:
        when = parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return max(0, math.ceil(when - (time.time() if now is None else now)))


def _raised(code: ErrorCode, message: str, *, retry_after: int | None = None, suggested_action: str | None = None,
            details: Any = None) -> ToolError:
    """The ``ToolError`` for one of the protocol's codes, its category and flags from its table."""
    body = error(code, message, retry_after=retry_after, suggested_action=suggested_action, details=details)
    return ToolError(body.code, body.message, category=body.category, recoverable=body.recoverable,
                     retryable=body.retryable, retry_after=retry_after, suggested_action=suggested_action,
                     details=details)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…(cut)"


def _message(body: Any, text: str) -> str:
    """The upstream's own words: a message field of a JSON error body, else the text itself."""
    for _ in range(3):  # {"error": {"message": ...}} and the like
        if not isinstance(body, dict):
            break
        field = next((body[k] for k in _MESSAGE_FIELDS if body.get(k)), None)
        if isinstance(field, str):
            return field
        if isinstance(field, list) and field:
            return "; ".join(json.dumps(f) if not isinstance(f, str) else f for f in field[:5])
        body = field
    return text.strip()


def strict_json(data: bytes | str) -> Any:
    """An upstream's JSON, or ``ValueError``: Python's ``json`` takes ``NaN``, ``Infinity``, numbers
    out of a float's range and lone surrogates, which no JSON reader need take and a result cannot
    carry (``NaN`` would reach the caller as ``null``, a surrogate fail as the tool's own fault),
    and recurses without a bound on nesting. msgspec refuses the first four and bounds the last. A
    leading byte order mark, which RFC 8259 lets a reader ignore (some servers send one), is."""
    data = data.removeprefix(b"\xef\xbb\xbf") if isinstance(data, bytes) else data.removeprefix("\ufeff")
    try:
        return msgspec.json.decode(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _body(text: str) -> Any:
    clipped = _clip(text, MAX_BODY)
    if clipped is text:
        try:
            return strict_json(text)
        except ValueError:
            pass
    return clipped


def answered(status: int, reason: str, text: str, header_retry_after: str | None, *, method: str) -> ToolError:
    """The error for an upstream's non-2xx answer; ``text`` is its body, credentials already hidden."""
    try:
        parsed: Any = strict_json(text) if text else None
    except ValueError:
        parsed = None
    said = _clip(_message(parsed, text), MAX_MESSAGE)
    heard = f"The upstream API answered {status} {reason}".rstrip() + (f": {said}" if said else ".")
    details = {"status": status, "body": _body(text)} if text else {"status": status}
    wait = retry_after(header_retry_after)
    if status == 429:
        return _raised("UPSTREAM_RATE_LIMITED", heard, retry_after=wait,
                         suggested_action="Wait retry_after seconds, then call again with a new request_id.",
                         details=details)
    if status >= 500:
        return unavailable(f"{heard} {MAY_HAVE_COMMITTED}" if method not in SAFE else heard,
                           details=details, retry_after=wait)
    if status == 404:
        return _raised("UPSTREAM_NOT_FOUND", heard, details=details,
                         suggested_action="Check the identifiers in the arguments; list what exists first.")
    if status in (400, 422):
        return _raised("UPSTREAM_REJECTED", heard, details=details,
                         suggested_action="Change the arguments as the message says, then call again.")
    if status in (401, 403):
        return _raised("UPSTREAM_FORBIDDEN", heard, details=details,
                         suggested_action="The worker's credentials for this API do not allow it: ask an operator.")
    if status in (409, 412):
        return _raised("UPSTREAM_CONFLICT", heard, details=details,
                         suggested_action="Read the current state, then decide whether to call again.")
    return _raised("UPSTREAM_ERROR", heard, details=details)


def unavailable(message: str, *, details: Any = None, retry_after: int | None = None) -> ToolError:
    """The upstream could not be reached, or failed on its side: trying again later may work."""
    return _raised("UPSTREAM_UNAVAILABLE", message, retry_after=retry_after,
                     suggested_action="Try again later with a new request_id.", details=details)


def bad_answer(message: str) -> ToolError:
    """A 2xx answer the tool cannot pass on (not the JSON it says it is, too large)."""
    return _raised("UPSTREAM_ERROR", message)
