"""MCP's system tools (``api.mcp.system``): ``carmy_job`` in every catalog, ``carmy_dead_letters``
for operators when ``CARMY_MCP_OPERATOR_TOOLS`` is on, answered by the API without a worker.
The official Python SDK's client, in process (the app through httpx's ASGI transport, its
lifespan running), against real Redis and one real worker of ``tests.toolsets.basic``, whose
job loop runs the jobs that must end dead-lettered.

Jobs are created with ``POST /agent/jobs`` on the same app.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx2
import jsonschema_rs
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, Tool
from redis.asyncio import Redis
from starlette.applications import Starlette

from api.app import create_app
from api.settings import ApiKey
from carmy_worker.sdk.schema import NO_INPUT_SCHEMA
from carmy_worker.store import keys
from carmy_worker.store.roster import Liveness
from carmy_worker.wire import ToolSpec, WorkerInfo, WorkerTool, msgpack_encoder
from tests.support import Proc, Stack, app_settings

ALICE, BOB, OPS = "alice-token-0123456789", "bob-token-0123456789ab", "ops-token-0123456789abc"
KEYS = {ALICE: ApiKey(principal="alice"), BOB: ApiKey(principal="bob"),
        OPS: ApiKey(principal="ops", permissions=frozenset({"carmy:operator"}))}
MODES = ["legacy", "auto"]
LATER_MS = 3_600_000  # a job due in an hour stays queued for the whole test


@pytest.fixture(scope="module")
async def app(stack: Stack, worker: Proc) -> AsyncIterator[Starlette]:
    """The defaults: operator tools off."""
    a = create_app(app_settings(stack.redis_url, api_keys=KEYS))
    async with a.router.lifespan_context(a):
        yield a


@pytest.fixture(scope="module")
async def operator_app(stack: Stack, worker: Proc) -> AsyncIterator[Starlette]:
    """CARMY_MCP_OPERATOR_TOOLS on."""
    a = create_app(app_settings(stack.redis_url, api_keys=KEYS, mcp_operator_tools=True))
    async with a.router.lifespan_context(a):
        yield a


@contextlib.asynccontextmanager
async def connect(app: Starlette, token: str | None, mode: str = "auto") -> AsyncIterator[Client]:
    headers = {"authorization": f"Bearer {token}"} if token else None
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://localhost", headers=headers) as http, \
            Client(streamable_http_client("http://localhost/mcp", http_client=http), mode=mode) as client:
        yield client


async def create_job(app: Starlette, token: str, body: dict[str, Any]) -> str:
    """POST /agent/jobs as the holder of ``token``; the new job's id."""
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://localhost") as http:
        r = await http.post("/agent/jobs", json=body, headers={"authorization": f"Bearer {token}"})
    assert r.status_code == 202, r.text
    job_id: str = r.json()["job_id"]
    return job_id


def tools_of(listed: list[Tool]) -> dict[str, Tool]:
    return {t.name: t for t in listed}


def answer_of(result: CallToolResult, tool: Tool) -> dict[str, Any]:
    """A system tool's answer: the same object as text and as structured content, which the
    tool's outputSchema admits (the TypeScript SDK checks it), and no execution behind it."""
    assert not result.is_error, result
    assert len(result.content) == 1 and result.content[0].type == "text"
    value: dict[str, Any] = json.loads(result.content[0].text)
    assert result.structured_content == value
    assert tool.output_schema is not None
    jsonschema_rs.validator_for(tool.output_schema).validate(value)
    assert "carmy/execution_id" not in (result.meta or {})
    return value


def error_of(result: CallToolResult) -> dict[str, Any]:
    """A system tool's refusal: ``isError`` with the error object as text and in ``_meta``, and
    no ``structuredContent`` (a client would check it against the outputSchema)."""
    assert result.is_error
    assert len(result.content) == 1 and result.content[0].type == "text"
    err: dict[str, Any] = json.loads(result.content[0].text)
    assert result.structured_content is None
    assert result.meta is not None and result.meta["carmy/error"] == err
    assert "carmy/execution_id" not in result.meta
    return err


@pytest.mark.parametrize("mode", MODES)
async def test_carmy_job_is_in_every_catalog(app: Starlette, mode: str) -> None:
    async with connect(app, ALICE, mode) as client:
        tools = tools_of((await client.list_tools()).tools)
    assert list(tools) == sorted(tools)
    assert {"carmy_job", "echo"} <= set(tools)
    assert "carmy_dead_letters" not in tools
    job = tools["carmy_job"]
    assert job.annotations is not None
    assert job.annotations.model_dump(by_alias=True, exclude_none=True) == {
        "readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
    assert job.input_schema["properties"].keys() == {"job_id"}
    assert job.input_schema["required"] == ["job_id"]
    assert job.input_schema["additionalProperties"] is False
    assert job.output_schema is not None and job.output_schema["type"] == "object"
    assert set(job.output_schema["required"]) >= {"job_id", "tool", "status", "attempts", "run_at", "created_at"}


@pytest.mark.parametrize("mode", MODES)
async def test_carmy_job_returns_the_view(app: Starlette, mode: str) -> None:
    job_id = await create_job(app, ALICE, {"tool": "echo", "arguments": {"text": "a"}, "request_id": f"v-{mode}",
                                           "delay_ms": LATER_MS, "max_attempts": 2})
    async with connect(app, ALICE, mode) as client:
        tools = tools_of((await client.list_tools()).tools)
        result = await client.call_tool("carmy_job", {"job_id": job_id})
    view = answer_of(result, tools["carmy_job"])
    assert (view["job_id"], view["tool"], view["status"]) == (job_id, "echo", "queued")
    assert (view["request_id"], view["attempts"], view["max_attempts"]) == (f"v-{mode}", 0, 2)
    assert view["executions"] == [] and view["last_error"] is None and view["result"] is None


async def test_another_principals_job_is_not_found(app: Starlette) -> None:
    job_id = await create_job(app, ALICE, {"tool": "echo", "arguments": {"text": "a"}, "delay_ms": LATER_MS})
    async with connect(app, BOB) as client:
        theirs = await client.call_tool("carmy_job", {"job_id": job_id})
        unknown = await client.call_tool("carmy_job", {"job_id": "job_00000000-0000-4000-8000-000000000000"})
    assert error_of(theirs) == error_of(unknown)
    assert error_of(theirs)["code"] == "JOB_NOT_FOUND"
    async with connect(app, OPS) as client:  # an operator sees everyone's
        assert not (await client.call_tool("carmy_job", {"job_id": job_id})).is_error


@pytest.mark.parametrize(("arguments", "path"), [({}, "$"), ({"job_id": 5}, "$.job_id"),
                                                 ({"job_id": "job_x", "extra": 1}, "$")])
async def test_carmy_job_arguments_are_checked(app: Starlette, arguments: dict[str, Any], path: str) -> None:
    async with connect(app, ALICE) as client:
        err = error_of(await client.call_tool("carmy_job", arguments))
    assert (err["code"], err["details"]["path"]) == ("INVALID_ARGUMENTS", path)


async def dead_letter(app: Starlette) -> str:
    """A job of alice's dead-lettered by the real worker: ``refuse`` fails retryably, and one
    attempt is all it may have."""
    job_id = await create_job(app, ALICE, {"tool": "refuse", "max_attempts": 1})
    deadline = time.monotonic() + 15
    async with connect(app, ALICE) as client:
        while True:
            view = json.loads((await client.call_tool("carmy_job", {"job_id": job_id})).content[0].text)
            if view["status"] == "dead_lettered" or time.monotonic() > deadline:
                break
            await anyio.sleep(0.05)
    assert view["status"] == "dead_lettered", view
    assert view["last_error"]["code"] == "OUT_OF_STOCK"
    return job_id


@pytest.mark.parametrize("mode", MODES)
async def test_dead_letters_for_an_operator_when_on(operator_app: Starlette, mode: str) -> None:
    job_id = await dead_letter(operator_app)
    async with connect(operator_app, OPS, mode) as client:
        tools = tools_of((await client.list_tools()).tools)
        assert list(tools) == sorted(tools)
        listing = tools["carmy_dead_letters"]
        assert listing.annotations is not None and listing.annotations.read_only_hint is True
        assert listing.input_schema["properties"]["limit"]["minimum"] == 1
        assert listing.input_schema["properties"]["limit"]["maximum"] == 100
        assert listing.input_schema.get("required", []) == []  # limit is optional
        answer = answer_of(await client.call_tool("carmy_dead_letters", {}), listing)
        one = answer_of(await client.call_tool("carmy_dead_letters", {"limit": 1}), listing)
        refused = error_of(await client.call_tool("carmy_dead_letters", {"limit": 101}))
    assert job_id in [j["job_id"] for j in answer["jobs"]]
    assert {j["status"] for j in answer["jobs"]} == {"dead_lettered"}
    assert len(one["jobs"]) == 1
    assert (refused["code"], refused["details"]["path"]) == ("INVALID_ARGUMENTS", "$.limit")


@pytest.mark.parametrize(("fixture", "token"), [("app", OPS), ("app", ALICE), ("operator_app", ALICE)])
async def test_dead_letters_hidden(app: Starlette, operator_app: Starlette, fixture: str, token: str) -> None:
    """Off by default, even for an operator; on, for operators only. Hidden, it is an unknown tool."""
    # Both apps asked for by name: an async fixture set up by getfixturevalue inside the test's
    # running loop fails (a test run first in its process, alone or under -n 4).
    async with connect({"app": app, "operator_app": operator_app}[fixture], token) as client:
        tools = tools_of((await client.list_tools()).tools)
        with pytest.raises(MCPError) as refused:
            await client.call_tool("carmy_dead_letters", {})
    assert "carmy_job" in tools and "carmy_dead_letters" not in tools
    assert refused.value.error.code == -32602
    assert refused.value.error.message == "Unknown tool: carmy_dead_letters"


async def test_other_reserved_names_are_unknown_tools(app: Starlette) -> None:
    async with connect(app, ALICE) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("carmy_jobs", {})
    assert refused.value.error.code == -32602


def foreign_tool(name: str) -> WorkerTool:
    spec = ToolSpec(name=name, description=f"A worker's {name}.", input_schema=NO_INPUT_SCHEMA, output_schema={},
                    effect="write", idempotent=False, parallel_safe=False, confirmation="none")
    return WorkerTool(spec=spec, timeout=30.0)


async def test_a_workers_reserved_name_loses_to_the_system_tool(app: Starlette, stack: Stack) -> None:
    """An older or foreign worker (the SDK refuses such names) publishing ``carmy_*`` tools: over
    MCP, the system's ``carmy_job`` is listed and answers; its other reserved names do not exist."""
    tools = [foreign_tool(n) for n in ("carmy_job", "carmy_export", "foreign_echo")]
    info = WorkerInfo(worker_id="mcp-jobs-foreign", started_ms=int(time.time() * 1000), tools=tools,
                      group="mcp-jobs-foreign")
    redis = Redis.from_url(stack.redis_url)
    try:
        liveness = Liveness(redis, dead_after=3600)
        await liveness.register(info.worker_id, msgpack_encoder.encode(info))
        await liveness.heartbeat(info.worker_id)
        await redis.publish(keys.CATALOG_CHANNEL, info.worker_id)
    finally:
        await redis.aclose()
    async with connect(app, ALICE) as client:
        deadline = time.monotonic() + 30  # as wait_until: a busy machine refreshes the catalog late
        # Each poll asks the server: the client keeps a listing for its ttlMs (CATALOG_MAX_AGE_S,
        # 60 s), so a first one taken before the catalog's refresh would be all it ever saw.
        while "foreign_echo" not in (listed := tools_of((await client.list_tools(cache_mode="bypass")).tools)):
            assert time.monotonic() < deadline, "the foreign worker's tools never reached the catalog"
            await anyio.sleep(0.05)
        unknown = await client.call_tool("carmy_job", {"job_id": "job_00000000-0000-4000-8000-000000000000"})
        with pytest.raises(MCPError) as refused:
            await client.call_tool("carmy_export", {})
    assert "carmy_export" not in listed
    assert listed["carmy_job"].description is not None and listed["carmy_job"].description.startswith("Read a job")
    assert error_of(unknown)["code"] == "JOB_NOT_FOUND"
    assert refused.value.error.code == -32602
