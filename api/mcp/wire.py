"""carmy/1 in MCP's vocabulary: catalog entries as MCP tools, final records as tool results,
``tool.progress`` events as progress notifications."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import msgspec

from carmy_worker.wire import Record, ToolSpec

META_EFFECT = "carmy/effect"
META_CONFIRMATION = "carmy/confirmation"
META_PARALLEL_SAFE = "carmy/parallel_safe"
META_REQUEST_ID = "carmy/request_id"  # on a call: its idempotency key, as request_id in carmy/1
META_EXECUTION_ID = "carmy/execution_id"
META_REPLAYED = "carmy/replayed"


def mcp_tool(spec: ToolSpec) -> types.Tool:
    """The MCP definition of a tool: hints from its effect, the exact metadata in ``_meta``.

    All four hints are set explicitly, because MCP's defaults are the pessimistic ones
    (destructive, open world).
    """
    # MCP up to 2025-11-25 only allows object output schemas; other outputs are text only.
    output_schema = spec.output_schema if spec.output_schema.get("type") == "object" else None
    return types.Tool(
        name=spec.name,
        description=spec.description,
        input_schema=spec.input_schema,
        output_schema=output_schema,
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


class _ResultBody(msgspec.Struct):
    """The parts of a stored result body a tool result is made of; JSON kept as sent."""

    execution_id: str
    data: msgspec.Raw = msgspec.Raw(b"null")
    error: msgspec.Raw = msgspec.Raw()  # empty: none


_result_decoder = msgspec.json.Decoder(_ResultBody)


def call_result(record: Record, *, replayed: bool) -> types.CallToolResult:
    """A final record as an MCP tool result.

    Success: the data as JSON text, and as ``structuredContent`` when it is an object.
    Failure: ``isError``, the error object as JSON text and as ``structuredContent.error``.
    """
    body = _result_decoder.decode(record.body)
    meta = {META_EXECUTION_ID: body.execution_id, META_REPLAYED: replayed}
    if len(body.error):
        text = bytes(body.error).decode()
        return types.CallToolResult(
            content=[types.TextContent(text=text)],
            structured_content={"error": msgspec.json.decode(text)},
            is_error=True,
            _meta=meta,
        )
    raw = bytes(body.data)
    value: Any = msgspec.json.decode(raw)
    return types.CallToolResult(
        content=[types.TextContent(text=raw.decode())],
        structured_content=value if isinstance(value, dict) else None,
        _meta=meta,
    )


class Progress(msgspec.Struct):
    """What MCP can carry of a ``tool.progress`` event (``partial`` has no MCP counterpart)."""

    progress: float
    total: float | None = None
    message: str | None = None


progress_decoder = msgspec.json.Decoder(Progress)
