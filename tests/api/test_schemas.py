"""A rewritten schema accepts exactly what its published one does, and finds a problem in every
value that one refuses: the rewrite only changes how a refusal is explained."""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.calling.schemas import InputSchema
from carmy_worker.sdk.schema import schema_for
from tests.toolsets.basic import Tree

TREE = schema_for(Tree)
# Leaf becomes a union of two untagged objects and a scalar: a choice only the union can make.
AMBIGUOUS = {**TREE, "$defs": {**TREE["$defs"], "Leaf": {"anyOf": [
    {"type": "object", "properties": {"type": {}, "value": {"type": "integer"}}, "required": ["value"],
     "additionalProperties": False},
    {"type": "object", "properties": {"type": {"const": "leaf"}}, "additionalProperties": False},
    {"type": ["string", "number"]},
]}}}
# A value that looks like a schema is a value: the const is not rewritten.
CONST = {"type": "object", "properties": {"x": {"const": {"anyOf": [1]}}, "y": {"anyOf": [{"type": "null"}, {}]}}}
# Alternatives told apart by const, enum, allOf, false, true and a $ref through a list: one type
# each, two admitting integers, none admitting objects.
SCALARS = {"type": "object", "properties": {
    "x": {"anyOf": [{"const": 1}, {"enum": ["x", None]}, {"allOf": [{"type": "number"}, {"minimum": 1.5}]}, False,
                    {"$ref": "#/properties/y/allOf/0"}]},
    "y": {"allOf": [{"type": "array", "items": {"oneOf": [True, {"type": "boolean"}]}}]},
}}
SCHEMAS = {
    "tagged": TREE,
    "tagged, oneOf": json.loads(json.dumps(TREE).replace('"anyOf"', '"oneOf"')),
    "ambiguous": AMBIGUOUS,
    "ambiguous, oneOf": json.loads(json.dumps(AMBIGUOUS).replace('"anyOf"', '"oneOf"')),
    "const": CONST,
    "scalars": SCALARS,
}

# Trees right and wrong (about one in five valid), and anything shaped a little like one.
scalars = st.sampled_from([None, True, 0, 1, 1.0, 1.5, -3, "x", "leaf", "branch", "one"])
wild = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["branch", "leaf", "twig", 1]), "value": inner,
        "children": st.lists(inner, max_size=3), "extra": inner}),
), max_leaves=8)
leaves = st.fixed_dictionaries({"type": st.just("leaf"), "value": st.one_of(st.integers(-3, 3), st.integers(), wild)})
trees = st.recursive(leaves, lambda inner: st.fixed_dictionaries(
    {"type": st.just("branch")}, optional={"children": st.lists(st.one_of(inner, inner, inner, wild), max_size=4)},
), max_leaves=20)
arguments = st.one_of(st.fixed_dictionaries({"root": trees}),
                      st.dictionaries(st.sampled_from(["root", "x", "y"]), st.one_of(scalars, wild)))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(max_examples=150, deadline=None)
@given(value=arguments)
def test_the_rewrite_accepts_what_the_schema_accepts(name: str, value: dict[str, Any]) -> None:
    schema = InputSchema.compile(SCHEMAS[name])
    assert schema.locator is not None and schema.locator is not schema.validator
    valid = schema.is_valid(value)
    assert schema.locator.is_valid(value) == valid
    assert (schema.locate(value) is None) == valid


def test_a_schema_without_a_union_is_its_own_locator() -> None:
    schema = InputSchema.compile({"type": "object", "properties": {"n": {"type": "integer"}}})
    assert schema.locator is schema.validator
    problem = schema.locate({"n": "one"})
    assert isinstance(problem, jsonschema_rs.ValidationError) and problem.message == '"one" is not of type "integer"'


def test_unions_nested_deep_inline_are_not_rewritten_into_a_huge_schema() -> None:
    # Each level's alternative admits every type and is copied into two branches: 2**30 copies.
    node: dict[str, Any] = {"type": "string"}
    for _ in range(30):
        node = {"anyOf": [{"type": "null"}, {"minLength": 1, "anyOf": [node, {"type": "integer"}]}]}
    schema = InputSchema.compile({"type": "object", "properties": {"x": node}})
    assert schema.locator is None
    assert not schema.is_valid({"x": ""})
