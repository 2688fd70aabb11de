"""JSON Schemas for tool inputs and outputs, generated from their msgspec types.

msgspec puts a ``$ref`` at the root of a Struct's schema; MCP and most agent frameworks reject
that, so the root is inlined and nested types stay in ``$defs``. Object schemas get
``additionalProperties: false`` so a hallucinated parameter is refused, not ignored.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema_rs
import msgspec

_DEFS = "#/$defs/"
NO_INPUT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def schema_for(tp: Any) -> dict[str, Any]:
    """A self-contained JSON Schema for ``tp``; raises ``TypeError`` for unsupported types."""
    (root,), defs = msgspec.json.schema_components([tp], ref_template=_DEFS + "{name}")
    defs = copy.deepcopy(defs)
    root = copy.deepcopy(root)
    ref = root.get("$ref", "") if len(root) == 1 else ""
    if ref.startswith(_DEFS):
        name = ref[len(_DEFS):]
        root = defs[name]
        # A recursive type still needs its definition; any other can leave $defs.
        others = {k: v for k, v in defs.items() if k != name}
        if ref not in json.dumps([root, others]):
            defs = others
    _close_objects(root)
    for sub in defs.values():
        _close_objects(sub)
    if defs:
        root = {**root, "$defs": defs}
    return root


def _close_objects(node: Any) -> None:
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            node.setdefault("additionalProperties", False)
        for value in node.values():
            _close_objects(value)
    elif isinstance(node, list):
        for value in node:
            _close_objects(value)


class SchemaError(ValueError):
    """A JSON Schema given as data cannot be a tool's: it is not JSON, not a schema, or has a root ``$ref``."""


def checked_schema(schema: object) -> jsonschema_rs.Validator:
    """``schema``, compiled as the API will compile it (Draft 2020-12 unless it says otherwise,
    formats not asserted); raises ``SchemaError`` saying why it cannot be published."""
    if not isinstance(schema, dict):
        raise SchemaError(f"a schema must be a JSON object (a dict), not {type(schema).__name__}")
    if "$ref" in schema:
        raise SchemaError("a schema's root must not be a $ref (MCP and agent frameworks refuse it): inline it")
    try:
        msgspec.json.encode(schema)
        return jsonschema_rs.validator_for(schema, validate_formats=False)
    except (TypeError, ValueError, jsonschema_rs.ReferencingError) as exc:
        raise SchemaError(f"not a valid JSON Schema: {exc}") from exc


class SchemaOutput:
    """The output check of a tool whose output schema is data: with a validator, a value the
    schema refuses raises ``jsonschema_rs.ValidationError`` (the runtime reports INVALID_OUTPUT);
    without one, any JSON passes."""

    __slots__ = ("_validator",)

    def __init__(self, validator: jsonschema_rs.Validator | None) -> None:
        self._validator = validator

    def decode(self, buf: bytes, /) -> Any:
        value = msgspec.json.decode(buf)
        if self._validator is not None:
            self._validator.validate(value)
        return value
