"""The argument check on its own: what a refusal says, however large or odd the arguments."""

from __future__ import annotations

from typing import Any

import pytest

from api.calling.catalog import CatalogTool, compile_validator
from api.calling.checks import Rejected, check_arguments
from carmy_worker.sdk.errors import ECHO_LIMIT
from carmy_worker.sdk.schema import schema_for
from carmy_worker.wire import ErrorBody, ToolSpec
from tests.toolsets.basic import Tree
from tests.trees import union_tree

BIG = "k" * 500_000
CUT = f"…(cut, {len(BIG)} characters)"


def tool(input_schema: dict[str, Any]) -> CatalogTool:
    spec = ToolSpec(name="t", description="A tool.", input_schema=input_schema, output_schema={"type": "null"},
                    effect="none", idempotent=True, parallel_safe=True, confirmation="none")
    return CatalogTool(spec=spec, timeout=1.0, validator=compile_validator("t", input_schema), groups=())


def refusal(schema: dict[str, Any], arguments: dict[str, Any]) -> ErrorBody:
    with pytest.raises(Rejected) as refused:
        check_arguments(tool(schema), arguments)
    return refused.value.error


def test_a_long_key_in_the_path_is_cut() -> None:
    schema = {"type": "object", "properties": {"tags": {"type": "object", "additionalProperties": {"type": "integer"}}}}
    err = refusal(schema, {"tags": {BIG: "one"}})
    assert err.details == {"path": "$.tags." + "k" * (ECHO_LIMIT - len("$.tags.")) + "…(cut, 500007 characters)",
                           "reason": '"one" is not of type "integer"'}
    assert len(err.message) < 2 * ECHO_LIMIT


def test_a_long_value_that_is_not_a_string_is_cut() -> None:
    err = refusal({"type": "object", "properties": {"n": {"type": "integer"}}}, {"n": [1] * 200_000})
    reason = err.details["reason"]
    assert reason.startswith("[1,1,") and reason.endswith(' is not of type "integer"')
    assert "…(cut, 400001 characters)" in reason  # the JSON text of the value
    assert len(reason) < 2 * ECHO_LIMIT


def test_a_long_unexpected_name_is_cut() -> None:
    err = refusal({"type": "object", "properties": {}, "additionalProperties": False}, {BIG: 1})
    assert err.details == {"path": "$", "reason": f"Additional properties are not allowed ('{'k' * ECHO_LIMIT}{CUT}' "
                                                  "was unexpected)"}


def test_many_long_unexpected_names_stay_short() -> None:
    err = refusal({"type": "object", "properties": {}, "additionalProperties": False},
                  {f"{i}" * 300: i for i in range(1, 10)})
    assert len(err.details["reason"]) < 2 * ECHO_LIMIT


def test_a_schema_that_does_not_compile_refuses_every_call() -> None:
    err = refusal({"type": "object", "properties": {"n": {"type": 5}}}, {})
    assert err.code == "INVALID_ARGUMENTS"
    assert "input schema of t cannot be used" in err.message


TREE = schema_for(Tree)  # a recursive union: Branch | Leaf, told apart by a "type" tag


def test_an_invalid_recursive_union_is_refused_where_its_first_wrong_leaf_is() -> None:
    # Half a MiB, every leaf wrong: jsonschema-rs's first error would be the union's at $.root,
    # holding the error of every node (seconds and a GiB to build); the check follows the tags.
    root, first_leaf = union_tree(512 * 1024, "one")
    err = refusal(TREE, {"root": root})
    assert err.details == {"path": first_leaf, "reason": '"one" is not of type "integer"'}


@pytest.mark.parametrize(("root", "path", "reason"), [
    ({"type": "twig"}, "$.root.type", '"twig" is not one of "branch" or "leaf"'),
    ({"value": 1}, "$.root", '"type" is a required property'),
    ({"type": "branch", "children": [{"type": "leaf", "value": 1}, 7]}, "$.root.children[1]",
     "7 is not valid under any of the schemas listed in the 'anyOf' keyword"),
], ids=["unknown tag", "no tag", "not an object"])
def test_a_union_that_no_alternative_could_match_is_the_problem(root: object, path: str, reason: str) -> None:
    assert refusal(TREE, {"root": root}).details == {"path": path, "reason": reason}


OPTIONAL = {"type": "object", "properties": {"zip": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}
AMBIGUOUS = {"type": "object", "properties": {"p": {"anyOf": [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}]}}}
ONE_OF = {"type": "object", "properties": {"p": {"oneOf": [{"type": "integer", "minimum": 10}, {"minimum": 0}]}}}


@pytest.mark.parametrize(("schema", "arguments", "path", "reason"), [
    (OPTIONAL, {"zip": 5}, "$.zip", "5 is not valid under any of the schemas listed in the 'anyOf' keyword"),
    (AMBIGUOUS, {"p": {"a": "x"}}, "$.p",
     '{"a":"x"} is not valid under any of the schemas listed in the \'anyOf\' keyword'),
    (ONE_OF, {"p": 12}, "$.p", "12 is valid under more than one of the schemas listed in the 'oneOf' keyword"),
    (ONE_OF, {"p": -1}, "$.p", "-1 is not valid under any of the schemas listed in the 'oneOf' keyword"),
], ids=["optional", "two objects without a tag", "oneOf, two match", "oneOf, none matches"])
def test_a_union_keeps_the_validators_own_message(schema: dict[str, Any], arguments: dict[str, Any], path: str,
                                                   reason: str) -> None:
    assert refusal(schema, arguments).details == {"path": path, "reason": reason}


def test_a_union_with_one_alternative_for_the_value_s_type_is_checked_inside_it() -> None:
    # Only {"minimum": 0} admits a number with a fraction, so its own error is the reason.
    assert refusal(ONE_OF, {"p": -1.5}).details == {"path": "$.p", "reason": "-1.5 is less than the minimum of 0"}


def test_a_union_in_a_draft_without_conditionals_is_checked_as_draft_7() -> None:
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", **OPTIONAL}
    assert refusal(schema, {"zip": 5}).details == {
        "path": "$.zip", "reason": "5 is not valid under any of the schemas listed in the 'anyOf' keyword"}


def test_a_union_that_cannot_be_rewritten_is_refused_at_the_root() -> None:
    # A $ref into an anyOf's items: the rewrite moves them, so no bounded search is possible.
    schema = {"type": "object", "properties": {**OPTIONAL["properties"], "code": {"$ref": "#/properties/zip/anyOf/0"}}}
    assert refusal(schema, {"code": 5}).details == {
        "path": "$", "reason": "the arguments are not valid under the input schema"}
