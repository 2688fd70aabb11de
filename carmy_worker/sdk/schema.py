"""JSON Schemas for tool inputs and outputs, generated from their msgspec types.

msgspec puts a ``$ref`` at the root of a Struct's schema; MCP and most agent frameworks reject
that, so the root is inlined and nested types stay in ``$defs``. Object schemas get
``additionalProperties: false`` so a hallucinated parameter is refused, not ignored.
"""

from __future__ import annotations

import copy
import json
from typing import Any

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
