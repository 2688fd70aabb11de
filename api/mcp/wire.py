"""carmy/1 in MCP's vocabulary: catalog entries as MCP tools, final records as tool results,
``tool.progress`` events as progress notifications."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import msgspec

from carmy_worker.wire import ErrorBody, Record, ToolSpec, json_encoder

META_EFFECT = "carmy/effect"
META_CONFIRMATION = "carmy/confirmation"
META_PARALLEL_SAFE = "carmy/parallel_safe"
META_REQUEST_ID = "carmy/request_id"  # on a call: its idempotency key, as request_id in carmy/1
META_EXECUTION_ID = "carmy/execution_id"
META_REPLAYED = "carmy/replayed"
META_ERROR = "carmy/error"  # on a failed call: the carmy/1 error object, for code that acts on it
META_NEXT_ACTIONS = "carmy/next_actions"  # on a failed call with suggestions: _agent.next_actions
META_TRACE_ID = "carmy/trace_id"  # tracing on: the execution's trace, as _agent.trace_id in carmy/1
META_TRACEPARENT = "traceparent"  # on a call: the caller's span (W3C), as the traceparent header


def mcp_tool(spec: ToolSpec, *, title: str | None = None, any_output: bool = False) -> types.Tool:
    """The MCP definition of a tool: hints from its effect, the exact metadata in ``_meta``.

    All four hints are set explicitly, because MCP's defaults are the pessimistic ones
    (destructive, open world). ``any_output``: the revision allows output schemas that are not
    objects (2026-07-28); up to 2025-11-25 only objects are, and other outputs are text only.
    """
    object_output = spec.output_schema.get("type") == "object"
    return types.Tool(
        name=spec.name,
        title=title,
        description=spec.description,
        input_schema=spec.input_schema,
        output_schema=spec.output_schema if object_output or (any_output and spec.output_schema) else None,
        annotations=types.ToolAnnotations(
            read_only_hint=spec.effect in ("none", "read"),
            destructive_hint=spec.effect == "destructive",
            idempotent_hint=spec.idempotent,
            open_world_hint=spec.effect == "external_write",
        ),
        _meta={
            META_EFFECT: spec.effect,
            META_CONFIRMATION: spec.confirmation,
            META_PARALLEL_SAFE: spec.parallel_safe,
        },
    )


class _Hints(msgspec.Struct):
    next_actions: msgspec.Raw = msgspec.Raw(b"[]")
    trace_id: str | None = None


class _ResultBody(msgspec.Struct):
    """The parts of a stored result body a tool result is made of; JSON kept as sent."""

    execution_id: str
    data: msgspec.Raw = msgspec.Raw(b"null")
    error: msgspec.Raw = msgspec.Raw()  # empty: none
    agent: _Hints = msgspec.field(name="_agent", default_factory=_Hints)


_result_decoder = msgspec.json.Decoder(_ResultBody)


def call_result(record: Record, *, replayed: bool, any_output: bool = False) -> types.CallToolResult:
    """A final record as an MCP tool result.

    Success: the data as JSON text, and as ``structuredContent`` when it is an object (any value
    when ``any_output``, as 2026-07-28 allows).

    Failure: ``isError`` and the error object as JSON text, which every client hands to the
    model, and in ``_meta["carmy/error"]`` for code that acts on its fields. Not in
    ``structuredContent``: clients (the TypeScript SDK, the Inspector) validate that against the
    tool's ``outputSchema`` even on errors, and would throw instead of showing the error.
    The body's ``_agent.next_actions``, when there are any, go in ``_meta["carmy/next_actions"]``
    (the list a JSON answer carries: both come from the same body), and its ``_agent.trace_id``
    (tracing on) in ``_meta["carmy/trace_id"]``.
    """
    body = _result_decoder.decode(record.body)
    meta: dict[str, Any] = {META_EXECUTION_ID: body.execution_id, META_REPLAYED: replayed}
    if body.agent.trace_id is not None:
        meta[META_TRACE_ID] = body.agent.trace_id
    if len(body.error):
        actions = bytes(body.agent.next_actions)
        if actions != b"[]":
            meta[META_NEXT_ACTIONS] = msgspec.json.decode(actions)
        return _error_result(bytes(body.error).decode(), meta)
    raw = bytes(body.data)
    value: Any = msgspec.json.decode(raw)
    return types.CallToolResult(
        content=[types.TextContent(text=raw.decode())],
        structured_content=value if isinstance(value, dict) or any_output else None,
        _meta=meta,
    )


def answer_result(value: msgspec.Struct) -> types.CallToolResult:
    """What the API answers itself (a system tool's): an object, as JSON text and as
    ``structuredContent``. No ``_meta``: no execution made it."""
    raw = json_encoder.encode(value)
    return types.CallToolResult(content=[types.TextContent(text=raw.decode())],
                                structured_content=msgspec.json.decode(raw))


def error_result(err: ErrorBody) -> types.CallToolResult:
    """A refusal the API answers itself (a system tool's), shaped as ``call_result``'s failures,
    without an execution id: no execution made it."""
    text = json_encoder.encode(err).decode()
    return _error_result(text, {})


def _error_result(text: str, meta: dict[str, Any]) -> types.CallToolResult:
    """``isError``, the error object as JSON text and in ``_meta["carmy/error"]``; never in
    ``structuredContent`` (``call_result`` says why)."""
    meta[META_ERROR] = msgspec.json.decode(text)
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True, _meta=meta)


class Progress(msgspec.Struct):
    """What MCP can carry of a ``tool.progress`` event (``partial`` has no MCP counterpart)."""

    progress: float
    total: float | None = None
    message: str | None = None


progress_decoder = msgspec.json.Decoder(Progress)
