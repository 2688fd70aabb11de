"""The argument check on its own: what a refusal says, however large or odd the arguments."""

from __future__ import annotations

from typing import Any

import pytest

from api.catalog import CatalogTool, compile_validator
from api.checks import Rejected, check_arguments
from carmy_worker.sdk.errors import ECHO_LIMIT
from carmy_worker.wire import ErrorBody, ToolSpec

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
    assert err.details["path"] == "$"
    assert err.details["reason"].startswith("Additional properties are not allowed ('kkk")
    assert len(err.details["reason"]) < 2 * ECHO_LIMIT


def test_a_schema_that_does_not_compile_refuses_every_call() -> None:
    err = refusal({"type": "object", "properties": {"n": {"type": 5}}}, {})
    assert err.code == "INVALID_ARGUMENTS"
    assert "input schema of t cannot be used" in err.message
