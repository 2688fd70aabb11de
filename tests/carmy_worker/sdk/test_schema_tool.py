"""``Toolbox.schema_tool``: a tool whose input and output are JSON Schemas given as data (what an
OpenAPI import registers), checked at registration as a typed tool is, and run by the runtime
with a dict in and any JSON out, or only what the output schema allows with ``validate_output``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import pytest

from carmy_worker import AgentContext, Context, Toolbox, ToolDefinitionError
from carmy_worker.loop import Signal
from carmy_worker.runtime.invoke import Outcome, invoke
from carmy_worker.sdk import lifecycle

INPUT = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"],
         "additionalProperties": False}
OUTPUT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


async def returns(ctx: Context, arguments: dict[str, Any]) -> Any:
    return arguments.get("value", {"n": len(arguments["id"])})


def register(box: Toolbox, **overrides: Any) -> Any:
    spec: dict[str, Any] = {"name": "lookup", "description": "Look it up.", "input_schema": INPUT,
                            "output_schema": OUTPUT, "effect": "read", "idempotent": True}
    return box.schema_tool(returns, **(spec | overrides))


def test_the_schemas_are_published_as_given() -> None:
    tool = register(Toolbox())
    assert (tool.spec.input_schema, tool.spec.output_schema) == (INPUT, OUTPUT)
    assert (tool.spec.effect, tool.spec.idempotent, tool.spec.confirmation) == ("read", True, "none")
    assert tool.is_async and tool.input_decoder.decode(b'{"id":"a"}') == {"id": "a"}


@pytest.mark.parametrize(("overrides", "problem"), [
    ({"name": "carmy_lookup"}, "the carmy_ prefix is reserved"),
    ({"name": "no spaces"}, "the name must be 1-128 characters"),
    ({"effect": "explode"}, "effect 'explode' is not one of"),
    ({"description": " "}, "a description is required"),
    ({"timeout": 0}, "timeout must be a number of seconds"),
    ({"input_schema": {"type": "array"}}, 'the input schema must be an object schema'),
    ({"input_schema": {"$ref": "#/$defs/X", "$defs": {"X": {"type": "object"}}}}, "must not be a \\$ref"),
    ({"output_schema": {"type": "integer", "minimum": "zero"}}, "not a valid JSON Schema"),
    ({"output_schema": {"properties": {"a": {"$ref": "#/$defs/Missing"}}}}, "not a valid JSON Schema"),
    ({"output_schema": ["not", "a", "dict"]}, "must be a JSON object"),
])
def test_every_check_of_a_typed_tool_and_the_schemas(overrides: dict[str, Any], problem: str) -> None:
    with pytest.raises(ToolDefinitionError, match=problem):
        register(Toolbox(), **overrides)


def test_a_name_registered_twice_is_refused() -> None:
    box = Toolbox()
    register(box)
    with pytest.raises(ToolDefinitionError, match="registered twice"):
        register(box)


async def run(tool: Any, arguments: dict[str, Any]) -> Outcome:
    ctx = Context(execution_id="exec_1", tool=tool.name, request_id=None, agent=AgentContext(),
                  emit=lambda *_: None)
    with ThreadPoolExecutor(1) as executor:
        return await invoke(tool, ctx, msgspec.json.encode(arguments), timeout=5, executor=executor,
                            cancelled=Signal(), max_result_bytes=10_000)


async def test_any_output_passes_without_validation() -> None:
    tool = register(Toolbox())
    assert (await run(tool, {"id": "abc"})).data == b'{"n":3}'
    assert (await run(tool, {"id": "x", "value": ["not", "the", "schema"]})).data == b'["not","the","schema"]'


async def test_validated_output_refuses_what_the_schema_does_not_allow() -> None:
    tool = register(Toolbox(), validate_output=True)
    assert (await run(tool, {"id": "abc"})).data == b'{"n":3}'
    refused = await run(tool, {"id": "x", "value": {"n": "three"}})
    assert refused.error is not None and refused.error.code == "INVALID_OUTPUT"


async def test_closers_run_once_at_shutdown_newest_first_and_a_failure_does_not_stop_the_rest() -> None:
    closed: list[str] = []

    async def close(name: str) -> None:
        closed.append(name)
        if name == "second":
            raise RuntimeError("already gone")

    lifecycle.on_shutdown(lambda: close("first"))
    lifecycle.on_shutdown(lambda: close("second"))
    await lifecycle.shut_down()
    await lifecycle.shut_down()
    assert closed == ["second", "first"]
