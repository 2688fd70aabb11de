"""The JSON-RPC envelope of a POST to ``/mcp``, checked before the SDK reads it.

On the handshake versions the SDK answers a body that is not one JSON-RPC message with
``-32602`` and pydantic's account of the union it tried. JSON-RPC says ``-32700`` for a body
that is not JSON and ``-32600`` for one that is not a request, notification or response (a
batch included: MCP removed them in 2025-06-18), with no internals in the message, which is
what the 2026-07-28 transport answers too. Checked in every revision, so that what only Python's
json reads (``NaN``, ``Infinity``, a lone surrogate) is not JSON in 2026-07-28 either.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.responses import Response

PARSE_ERROR = -32700
INVALID_REQUEST = -32600


class _Envelope(msgspec.Struct):
    jsonrpc: str
    method: str | msgspec.UnsetType = msgspec.UNSET
    params: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET  # MCP's params are always an object
    id: int | str | msgspec.UnsetType | None = msgspec.UNSET
    result: Any = msgspec.UNSET
    error: Any = msgspec.UNSET


_decoder = msgspec.json.Decoder(_Envelope)


def envelope_error(body: bytes) -> Response | None:
    """The ``400`` answer to a body that is not one JSON-RPC 2.0 message; None if it is one."""
    try:
        message = _decoder.decode(body)
    except msgspec.ValidationError:
        return _error(INVALID_REQUEST, "Invalid Request: the body must be one JSON-RPC 2.0 message (an object, "
                                       'with "params" an object if any; batches are not supported).')
    except (msgspec.DecodeError, RecursionError):
        return _error(PARSE_ERROR, "Parse error: the body is not JSON.")
    if message.jsonrpc != "2.0":
        return _error(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0".')
    is_response = message.method is msgspec.UNSET and message.id is not msgspec.UNSET and (
        (message.result is msgspec.UNSET) != (message.error is msgspec.UNSET))
    if message.method is msgspec.UNSET and not is_response:
        return _error(INVALID_REQUEST, 'Invalid Request: a request or notification needs a "method".')
    if message.method is not msgspec.UNSET and message.id is None:
        # JSON-RPC allows it, MCP does not; the SDK would take it for a notification and answer nothing.
        return _error(INVALID_REQUEST, 'Invalid Request: a request\'s "id" is a string or an integer, not null.')
    return None


def _error(code: int, text: str) -> Response:
    body = msgspec.json.encode({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": text}})
    return Response(body, 400, media_type="application/json")
