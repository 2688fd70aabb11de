"""Published JSON Schemas: self-contained, an object at the root, closed objects."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, TypedDict

import jsonschema
import msgspec
import pytest

from carmy_worker.sdk.schema import schema_for


class Address(msgspec.Struct):
    city: str
    zip: str | None = None


class Customer(msgspec.Struct):
    name: str
    address: Address
    previous: list[Address] = []
    tags: dict[str, int] = {}


class Node(msgspec.Struct):
    value: int
    children: list[Node] = []


class Tree(msgspec.Struct):
    root: Node


class Point(TypedDict):
    x: int
    y: int


class Shape(msgspec.Struct):
    points: list[Point]


def objects(node: Any) -> Iterator[dict[str, Any]]:
    """Every schema node with ``properties``, wherever it is."""
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            yield node
        for value in node.values():
            yield from objects(value)
    elif isinstance(node, list):
        for value in node:
            yield from objects(value)


def refs(node: Any) -> set[str]:
    return set(_refs(node))


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("tp", [Address, Customer, Node, Tree, Shape, Point])
def test_root_is_an_inline_object(tp: Any) -> None:
    schema = schema_for(tp)
    assert "$ref" not in schema
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    # Every reference resolves inside the document itself.
    for ref in refs(schema):
        assert ref.startswith("#/$defs/")
        assert ref.removeprefix("#/$defs/") in schema["$defs"]


def test_flat_struct_has_no_defs() -> None:
    schema = schema_for(Address)
    assert "$defs" not in schema
    assert schema["properties"] == {"city": {"type": "string"},
                                    "zip": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}}
    assert schema["required"] == ["city"]


def test_nested_struct_is_kept_in_defs_and_referenced() -> None:
    schema = schema_for(Customer)
    assert schema["properties"]["address"] == {"$ref": "#/$defs/Address"}
    assert schema["properties"]["previous"]["items"] == {"$ref": "#/$defs/Address"}
    assert set(schema["$defs"]) == {"Address"}  # the root is inlined, not also kept as a definition
    assert schema["$defs"]["Address"]["properties"]["city"] == {"type": "string"}


def test_recursive_root_keeps_its_own_definition() -> None:
    schema = schema_for(Node)
    assert schema["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert schema["$defs"]["Node"]["type"] == "object"
    check = validator(schema)
    check.validate({"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}]})
    with pytest.raises(jsonschema.ValidationError):
        check.validate({"value": 1, "children": [{"value": 2, "children": [{"value": "three"}]}]})


def test_recursive_nested_type() -> None:
    schema = schema_for(Tree)
    assert schema["properties"]["root"] == {"$ref": "#/$defs/Node"}
    assert set(schema["$defs"]) == {"Node"}
    validator(schema).validate({"root": {"value": 1, "children": [{"value": 2}]}})


@pytest.mark.parametrize("tp", [Customer, Node, Tree, Shape])
def test_every_object_is_closed(tp: Any) -> None:
    schema = schema_for(tp)
    found = list(objects(schema))
    assert len(found) >= 2  # the root and at least one nested object
    assert all(obj["additionalProperties"] is False for obj in found)


def test_closed_objects_refuse_unknown_fields_at_every_depth() -> None:
    check = validator(schema_for(Customer))
    check.validate({"name": "Ada", "address": {"city": "London"}, "tags": {"vip": 1}})
    with pytest.raises(jsonschema.ValidationError, match="color"):
        check.validate({"name": "Ada", "address": {"city": "London"}, "color": "red"})
    with pytest.raises(jsonschema.ValidationError, match="street"):
        check.validate({"name": "Ada", "address": {"city": "London", "street": "Baker"}})
    with pytest.raises(jsonschema.ValidationError, match="street"):
        check.validate({"name": "Ada", "address": {"city": "London"}, "previous": [{"city": "X", "street": "Y"}]})
    shape = validator(schema_for(Shape))
    with pytest.raises(jsonschema.ValidationError, match="z"):
        shape.validate({"points": [{"x": 1, "y": 2, "z": 3}]})


def test_mapping_keeps_its_value_schema() -> None:
    tags = schema_for(Customer)["properties"]["tags"]
    assert tags["additionalProperties"] == {"type": "integer"}
    assert schema_for(dict[str, int]) == {"type": "object", "additionalProperties": {"type": "integer"}}


@pytest.mark.parametrize(("tp", "expected"), [
    (list[int], {"type": "array", "items": {"type": "integer"}}),
    (None, {"type": "null"}),
    (type(None), {"type": "null"}),
    (int, {"type": "integer"}),
    (str | None, {"anyOf": [{"type": "string"}, {"type": "null"}]}),
])
def test_output_schemas_of_non_objects(tp: Any, expected: dict[str, Any]) -> None:
    assert schema_for(tp) == expected


def test_list_of_structs_keeps_defs() -> None:
    schema = schema_for(list[Address])
    assert schema["items"] == {"$ref": "#/$defs/Address"}
    assert schema["$defs"]["Address"]["additionalProperties"] is False


def test_schemas_are_json_and_independent() -> None:
    first = schema_for(Customer)
    json.dumps(first)
    first["properties"].clear()
    first["$defs"]["Address"]["properties"].clear()
    second = schema_for(Customer)
    assert set(second["properties"]) == {"name", "address", "previous", "tags"}
    assert set(second["$defs"]["Address"]["properties"]) == {"city", "zip"}


def test_unsupported_type_raises_type_error() -> None:
    class Opaque:
        pass

    with pytest.raises(TypeError):
        schema_for(Opaque)
