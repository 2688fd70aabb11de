"""The tools the official MCP conformance suite (``@modelcontextprotocol/conformance``) calls by
name in its server scenarios, as far as an execution backend can serve them
(tests/conformance/test_conformance.py runs the suite against a worker serving these).

Not here, because a Carmy tool cannot do what the scenario asks of it:

* ``test_image_content``, ``test_audio_content``, ``test_embedded_resource``,
  ``test_multiple_content_types``: a tool returns JSON data, which /mcp sends as one text item
  (and as ``structuredContent``); there is no way to return image, audio or resource content;
* ``test_tool_with_logging``: /mcp has no logging capability (``notifications/message``);
* ``test_sampling``, ``test_elicitation``, ``test_elicitation_sep1034_defaults``,
  ``test_elicitation_sep1330_enums``: a tool cannot send the client a request
  (``sampling/createMessage``, ``elicitation/create``) and wait for its answer;
* ``test_missing_capability``, ``test_streaming_elicitation`` (server-stateless, 2026-07-28):
  tools that need the client's sampling or elicitation; ``test_trigger_tool_change`` and
  ``test_trigger_prompt_change``: /mcp has no list-changed notifications to trigger;
* the ``test_input_required_result_*`` tools (input-required-result-*, SEP-2322): a tool
  cannot answer with an ``InputRequiredResult`` that asks the client for input;
* the tasks extension's ``confirm_delete``, ``multi_input`` and ``test_tool_with_task``
  (tasks-mrtr-*): they ask the client for input, during a task or before one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import msgspec

from carmy_worker import Context, Toolbox, ToolError

tools = Toolbox()
log = logging.getLogger("carmy.tests.conformance")


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def test_simple_text(ctx: Context) -> str:
    """Return a simple text (tools-call-simple-text)."""
    # Sent as JSON text: the content's text is this string in quotes.
    return "This is a simple text response for testing."


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def test_error_handling(ctx: Context) -> None:
    """Always fail (tools-call-error)."""
    raise ToolError("TEST_ERROR", "This tool intentionally returns an error for testing")


class Done(msgspec.Struct):
    done: bool


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def test_tool_with_progress(ctx: Context) -> Done:
    """Report progress 0, 50 and 100 of 100, 50 ms apart (tools-call-with-progress)."""
    for i, step in enumerate((0, 50, 100)):
        if i:
            await asyncio.sleep(0.05)
        ctx.progress(step, total=100)
    return Done(done=True)


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def test_reconnection(ctx: Context) -> Done:
    """Answer after a moment (server-sse-polling). The scenario wants a tool that closes its SSE
    stream mid-call for the client to resume with Last-Event-ID; Carmy's /mcp is stateless and
    keeps no events to resume from, so the answer comes on the call's own stream."""
    await asyncio.sleep(0.05)
    return Done(done=True)


# json-schema-2020-12 wants this tool's inputSchema to keep "$defs" with an "address" entry:
# msgspec names a definition after its class, hence the lower-case class name.
class address(msgspec.Struct):
    street: str = ""
    city: str = ""


class JsonSchemaInput(msgspec.Struct):
    name: str = ""
    address: address | None = None


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def json_schema_2020_12_tool(ctx: Context, input: JsonSchemaInput) -> Done:
    """Tool with JSON Schema 2020-12 features (json-schema-2020-12)."""
    return Done(done=True)


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def test_logging_tool(ctx: Context) -> Done:
    """Log a line (server-stateless, 2026-07-28): to the worker's log, as every Carmy tool logs;
    the scenario checks that no ``notifications/message`` reaches a client that set no log
    level, and /mcp sends none at all."""
    log.info("test_logging_tool called")
    return Done(done=True)


class RegionInput(msgspec.Struct):
    # x-mcp-header (SEP-2243, 2026-07-28): a client also sends this argument as the header
    # Mcp-Param-Region, for routing; the SDK checks that the header and the body agree.
    region: Annotated[str, msgspec.Meta(extra_json_schema={"x-mcp-header": "Region"})]


class Region(msgspec.Struct):
    region: str


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def test_custom_header(ctx: Context, input: RegionInput) -> Region:
    """Echo a region that also travels as an Mcp-Param-Region header
    (http-custom-header-server-validation)."""
    return Region(region=input.region)


# --- the tasks extension (SEP-2663), tasks-*: the test serves these with CARMY_MCP_TASK_AFTER
# well under a second, so that a call of a second or more becomes a task.


class GreetInput(msgspec.Struct):
    name: str


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def greet(ctx: Context, input: GreetInput) -> str:
    """Greet someone, at once (tasks-*: a call that answers inline)."""
    return f"Hello, {input.name}!"


class ComputeInput(msgspec.Struct):
    seconds: float = 0
    label: str = ""


class Computed(msgspec.Struct):
    label: str
    seconds: float


@tools.tool(effect="none", idempotent=True, parallel_safe=True, timeout=120)
async def slow_compute(ctx: Context, input: ComputeInput) -> Computed:
    """Work for ``seconds`` (tasks-*: a call that becomes a task, and one that is cancelled)."""
    await asyncio.sleep(input.seconds)
    return Computed(label=input.label, seconds=input.seconds)


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def failing_job(ctx: Context) -> Done:
    """Fail with a tool error after a while (tasks-*: a task that completes with isError)."""
    await asyncio.sleep(1.5)
    raise ToolError("JOB_FAILED", "The job failed, as it always does.")


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def protocol_error_job(ctx: Context) -> Done:
    """Crash after a while (tasks-lifecycle wants a task that ends ``failed``; Carmy reports a
    crash as the tool error TOOL_PANIC, so the task ends ``completed`` with isError)."""
    await asyncio.sleep(1.5)
    raise RuntimeError("the job crashed")
