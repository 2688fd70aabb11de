"""OpenAPI schemas as Draft 2020-12 JSON Schemas."""

from __future__ import annotations

from typing import Any

import jsonref

from carmy_worker.openapi.schemas import SchemaBuilder


def built(schema: Any, *, openapi_30: bool = True, direction: Any = "output") -> dict[str, Any]:
    document = jsonref.replace_refs({"root": schema, "components": {"schemas": {
        "Node": {"type": "object", "properties": {"children": {"type": "array",
                                                                 "items": {"$ref": "#/components/schemas/Node"}}}},
        "Id": {"type": "string", "description": "an id"}}}})
    return SchemaBuilder(openapi_30=openapi_30, direction=direction).root(document["root"])


def test_nullable_in_30() -> None:
    assert built({"type": "string", "nullable": True, "enum": ["a", "b"]}) == {"type": ["string", "null"],
                                                                               "enum": ["a", "b", None]}
    assert built({"allOf": [{"$ref": "#/components/schemas/Id"}], "nullable": True}) == {
        "anyOf": [{"allOf": [{"$ref": "#/$defs/Id"}]}, {"type": "null"}],
        "$defs": {"Id": {"type": "string", "description": "an id"}}}
    # 3.1 has no such keyword: left as it is (an annotation).
    assert built({"type": "string", "nullable": True}, openapi_30=False) == {"type": "string", "nullable": True}


def test_boolean_exclusive_bounds_in_30() -> None:
    assert built({"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 9, "exclusiveMaximum": False}) \
        == {"type": "number", "exclusiveMinimum": 0, "maximum": 9}


def test_openapis_own_keywords_are_dropped() -> None:
    assert built({"type": "object", "discriminator": {"propertyName": "kind"}, "xml": {"name": "x"},
                  "example": {"a": 1}, "x-internal": True, "externalDocs": {"url": "https://x"}}) == {"type": "object"}


def test_a_recursive_schema_stays_finite() -> None:
    assert built({"$ref": "#/components/schemas/Node"}) == {
        "type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
        "$defs": {"Node": {"type": "object", "properties": {"children": {"type": "array",
                                                                         "items": {"$ref": "#/$defs/Node"}}}}}}


def test_a_reference_with_siblings_in_31_keeps_them() -> None:
    assert built({"$ref": "#/components/schemas/Id", "description": "the pet's id"}, openapi_30=False) == {
        "$ref": "#/$defs/Id", "description": "the pet's id", "$defs": {"Id": {"type": "string",
                                                                                "description": "an id"}}}


def test_read_only_is_not_an_input_and_write_only_not_required_of_an_output() -> None:
    schema = {"type": "object", "required": ["id", "secret", "name"], "properties": {
        "id": {"type": "string", "readOnly": True}, "secret": {"type": "string", "writeOnly": True},
        "name": {"type": "string"}}}
    assert built(schema, direction="input") == {"type": "object", "required": ["secret", "name"], "properties": {
        "secret": {"type": "string", "writeOnly": True}, "name": {"type": "string"}}}
    assert built(schema, direction="output")["required"] == ["id", "name"]
