"""MCP tasks (SEP-2663, ``io.modelcontextprotocol/tasks``) at /mcp, as raw 2026-07-28 JSON-RPC
over HTTP, and with the official Python SDK's client (which has no tasks of its own: a small
extension through its hooks declares them and polls), against the app under uvicorn, real
Redis and a real worker. The ``gate`` tool runs until the test opens its gate (a file), so a
call is a task for exactly as long as a test wants it to be.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, Request, Result

from api.app import create_app
from api.settings import ApiKey
from tests.api.test_mcp import appears, serving_mcp
from tests.support import Stack, app_settings

T = TypeVar("T")

VERSION = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
WITH_TASKS = {"extensions": {TASKS: {}}}
TASK_AFTER = 0.3  # seconds a call is followed before it becomes a task
ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789ab"


@pytest.fixture(scope="module")
def url(stack: Stack) -> Iterator[str]:
    stack.worker()
    with serving_mcp(create_app(app_settings(stack.redis_url, mcp_task_after=TASK_AFTER))) as u:
        yield u


@pytest.fixture(scope="module")
def keyed_url(stack: Stack, url: str) -> Iterator[str]:
    keys = {ALICE: ApiKey(principal="alice"), BOB: ApiKey(principal="bob")}
    with serving_mcp(create_app(app_settings(stack.redis_url, mcp_task_after=TASK_AFTER, api_keys=keys))) as u:
        yield u


class Mcp:
    """A 2026-07-28 client speaking raw JSON-RPC, one POST per request."""

    def __init__(self, http: httpx.AsyncClient, url: str, token: str | None = None) -> None:
        self.http, self.url, self.ids = http, url, 0
        self.auth = {"authorization": f"Bearer {token}"} if token else {}

    async def request(self, method: str, params: dict[str, Any], *, capabilities: dict[str, Any] | None = None,
                      meta: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> dict[str, Any]:
        """The JSON-RPC response message (the last message of an SSE answer)."""
        self.ids += 1
        envelope = {"io.modelcontextprotocol/protocolVersion": VERSION,
                    "io.modelcontextprotocol/clientCapabilities": WITH_TASKS if capabilities is None else capabilities,
                    **(meta or {})}
        sent = {"accept": "application/json, text/event-stream", "mcp-protocol-version": VERSION,
                "mcp-method": method, **self.auth}
        name = params.get("name", params.get("taskId"))
        if name is not None:  # tasks/* carry their task id in Mcp-Name (SEP-2663)
            sent["mcp-name"] = name
        sent.update(headers or {})
        body = {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": {**params, "_meta": envelope}}
        message = answer(await self.http.post(self.url, headers=sent, json=body))
        assert message["id"] == self.ids
        return message

    async def result(self, method: str, params: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        message = await self.request(method, params, **kwargs)
        assert "result" in message, message
        result: dict[str, Any] = message["result"]
        return result

    async def call(self, tool: str, arguments: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return await self.result("tools/call", {"name": tool, "arguments": arguments}, **kwargs)

    async def task(self, task_id: str) -> dict[str, Any]:
        return await self.result("tasks/get", {"taskId": task_id})

    async def settled(self, task_id: str) -> dict[str, Any]:
        """tasks/get once the task has left ``working``."""
        async def poll() -> dict[str, Any] | None:
            task = await self.task(task_id)
            return None if task["status"] == "working" else task

        return await until(poll)


def answer(r: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC response in an HTTP answer: its JSON body, or the last message of its SSE stream."""
    if not r.headers["content-type"].startswith("text/event-stream"):
        message: dict[str, Any] = r.json()
        return message
    messages = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
    return next(m for m in reversed(messages) if "id" in m)


async def until(poll: Callable[[], Awaitable[T | None]], timeout: float = 15.0) -> T:
    """The first answer of ``poll`` that is not None (an async ``wait_until``)."""
    deadline = time.monotonic() + timeout
    while (value := await poll()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not met within {timeout:g} s")
        await anyio.sleep(0.05)
    return value


async def first_message(client: Mcp, task_id: str) -> dict[str, Any] | None:
    task = await client.task(task_id)
    return task if task.get("statusMessage") != "Running." else None


def open_gate(stack: Stack, tag: str) -> None:
    (stack.tmp / f"gate-open-{tag}").touch()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def moment(iso: str) -> datetime.datetime:
    assert iso.endswith("Z")
    return datetime.datetime.fromisoformat(iso)


@contextlib.asynccontextmanager
async def mcp(url: str, token: str | None = None) -> AsyncIterator[Mcp]:
    async with httpx.AsyncClient(timeout=30) as http:
        yield Mcp(http, url, token)


def error_object(result: dict[str, Any]) -> dict[str, Any]:
    """A tool error result: the carmy/1 error as JSON text and in _meta, no structuredContent."""
    assert result["isError"] is True
    assert [c["type"] for c in result["content"]] == ["text"]
    err: dict[str, Any] = json.loads(result["content"][0]["text"])
    assert "structuredContent" not in result
    assert result["_meta"]["carmy/error"] == err
    return err


# --- advertising and opting in -------------------------------------------------------------

async def test_discover_advertises_the_extension(url: str) -> None:
    async with mcp(url) as client:
        discovered = await client.result("server/discover", {})
    assert discovered["capabilities"]["extensions"] == {TASKS: {}}


async def test_handshake_versions_know_nothing_of_tasks(url: str) -> None:
    accept = {"accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.post(url, headers=accept, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {"extensions": {TASKS: {}}},
            "clientInfo": {"name": "raw", "version": "1"}}})
        assert "extensions" not in answer(r)["result"]["capabilities"]
        headers = {**accept, "mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        await http.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        r = await http.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "tasks/get",
                                                        "params": {"taskId": "exec_x"}})
    assert answer(r)["error"]["code"] == -32601


async def test_quick_tool_answers_inline(stack: Stack, url: str) -> None:
    # Patient enough for a busy machine: a quick tool is never a task.
    with serving_mcp(create_app(app_settings(stack.redis_url, mcp_task_after=10))) as patient:
        async with mcp(patient) as client:
            result = await client.call("echo", {"text": "ab", "times": 2})
    assert result["resultType"] == "complete"
    assert "taskId" not in result
    assert result["structuredContent"] == {"text": "abab"}
    assert result["_meta"]["carmy/execution_id"].startswith("exec_")


async def test_no_task_without_the_capability_in_the_request(url: str) -> None:
    async with mcp(url) as client:
        # Twice the patience, and still the result: this request did not declare tasks.
        result = await client.call("linger", {"seconds": 2 * TASK_AFTER}, capabilities={})
        assert result["resultType"] == "complete" and result["structuredContent"] == {}
        refused = await client.request("tasks/get", {"taskId": result["_meta"]["carmy/execution_id"]},
                                       capabilities={})
    assert refused["error"]["code"] == -32021
    assert refused["error"]["data"]["requiredCapabilities"] == {"extensions": {TASKS: {}}}


# --- the life of a task --------------------------------------------------------------------

async def test_slow_tool_becomes_a_task(url: str, stack: Stack) -> None:
    async with mcp(url) as client:
        created = await client.call("gate", {"tag": "life"})
        assert created["resultType"] == "task"
        assert created["status"] == "working"
        task_id = created["taskId"]
        assert task_id.startswith("exec_")
        assert await appears(stack.tmp / "gate-start-life", 10)
        assert lines(stack.tmp / "gate-start-life") == [task_id]
        assert created["ttlMs"] == 86400 * 1000 and created["pollIntervalMs"] == 1000

        # The tool's progress message, once its event is out (it is published as the tool goes on).
        working = await until(lambda: first_message(client, task_id))
        assert working["resultType"] == "complete"
        assert (working["taskId"], working["status"], working["statusMessage"]) == (
            task_id, "working", "waiting at the gate")
        assert working["createdAt"] == created["createdAt"]
        assert "result" not in working

        open_gate(stack, "life")
        done = await client.settled(task_id)
        assert await client.result("tasks/update", {"taskId": task_id, "inputResponses": {}}) == {
            "resultType": "complete", "_meta": done["_meta"]}
    assert done["status"] == "completed"
    assert moment(done["createdAt"]) <= moment(done["lastUpdatedAt"])
    assert moment(done["lastUpdatedAt"]) > moment(working["lastUpdatedAt"])
    result = done["result"]
    assert result["structuredContent"] == {"n": 1}
    assert json.loads(result["content"][0]["text"]) == {"n": 1}
    assert result["_meta"]["carmy/execution_id"] == task_id
    assert not result.get("isError")


async def test_task_is_an_asynchronous_execution(url: str, stack: Stack) -> None:
    base = url.removesuffix("/mcp")
    async with mcp(url) as client, httpx.AsyncClient(base_url=base, timeout=10) as http:
        task_id = (await client.call("gate", {"tag": "async"}))["taskId"]
        assert await appears(stack.tmp / "gate-start-async", 10)
        running = await http.get(f"/agent/executions/{task_id}")
        assert running.status_code == 202
        assert running.json() == {"execution_id": task_id, "status": "running"}
        open_gate(stack, "async")
        await client.settled(task_id)
        finished = await http.get(f"/agent/executions/{task_id}")
    assert finished.status_code == 200
    assert finished.json()["data"] == {"n": 1}


async def test_tool_error_completes_the_task(url: str, stack: Stack) -> None:
    async with mcp(url) as client:
        task_id = (await client.call("gate", {"tag": "wall", "fail": True}))["taskId"]
        open_gate(stack, "wall")
        done = await client.settled(task_id)
    assert done["status"] == "completed"  # `failed` is for JSON-RPC errors only
    assert done["result"]["isError"] is True
    assert done["result"]["_meta"]["carmy/execution_id"] == task_id
    err = error_object(done["result"])
    assert (err["code"], err["category"]) == ("GATE_CLOSED", "conflict")


async def test_cancel_cancels_the_running_tool(url: str, stack: Stack) -> None:
    async with mcp(url) as client:
        task_id = (await client.call("gate", {"tag": "cancel"}))["taskId"]
        assert await appears(stack.tmp / "gate-start-cancel", 10)  # running, not merely queued
        ack = await client.result("tasks/cancel", {"taskId": task_id})
        assert ack["resultType"] == "complete" and set(ack) == {"resultType", "_meta"}
        assert await appears(stack.tmp / "gate-cancelled-cancel", 10)  # else it waits at its gate for good
        assert lines(stack.tmp / "gate-cancelled-cancel") == [task_id]
        cancelled = await client.settled(task_id)
        assert cancelled["status"] == "cancelled" and "result" not in cancelled
        # Cancelling a finished task is acknowledged all the same.
        assert (await client.result("tasks/cancel", {"taskId": task_id}))["resultType"] == "complete"


async def test_client_leaving_before_the_task_cancels_it(stack: Stack, url: str) -> None:
    with serving_mcp(create_app(app_settings(stack.redis_url, mcp_task_after=30))) as patient:
        async with mcp(patient) as client, anyio.create_task_group() as calls:
            calls.start_soon(client.call, "gate", {"tag": "leave"})
            assert await appears(stack.tmp / "gate-start-leave", 10)
            calls.cancel_scope.cancel()  # gone before either answer: nobody will ever know its handle
        assert await appears(stack.tmp / "gate-cancelled-leave", 10)


# --- scope and retries ---------------------------------------------------------------------

async def test_another_principal_cannot_see_the_task(keyed_url: str, stack: Stack) -> None:
    async with mcp(keyed_url, ALICE) as alice, mcp(keyed_url, BOB) as bob:
        task_id = (await alice.call("gate", {"tag": "mine"}))["taskId"]
        for method in ("tasks/get", "tasks/update", "tasks/cancel"):
            refused = await bob.request(method, {"taskId": task_id})
            assert refused["error"]["code"] == -32602, method
            assert "Unknown task" in refused["error"]["message"]
        unknown = await alice.request("tasks/get", {"taskId": "exec_00000000-0000-4000-8000-000000000000"})
        assert unknown["error"] == refused["error"]
        assert (await alice.request("tasks/get", {"taskId": "not-an-id"}))["error"] == refused["error"]
        assert (await alice.task(task_id))["status"] == "working"  # bob's cancel did nothing
        assert not (stack.tmp / "gate-cancelled-mine").exists()
        open_gate(stack, "mine")
        assert (await alice.settled(task_id))["status"] == "completed"


async def test_a_task_request_routed_by_another_name_is_refused(url: str, stack: Stack) -> None:
    """A proxy routes tasks/* by Mcp-Name (SEP-2663): a body naming another task is refused."""
    async with mcp(url) as client:
        task_id = (await client.call("gate", {"tag": "routed"}))["taskId"]
        other = "exec_00000000-0000-4000-8000-000000000000"
        refused = await client.request("tasks/cancel", {"taskId": task_id}, headers={"mcp-name": other})
        assert refused["error"]["code"] == -32020
        assert (await client.task(task_id))["status"] == "working"  # the refused cancel did nothing
        open_gate(stack, "routed")
        assert (await client.settled(task_id))["status"] == "completed"


async def test_retry_gets_the_same_task_then_the_result(url: str, stack: Stack) -> None:
    meta = {"carmy/request_id": "task-retry"}
    async with mcp(url) as client:
        first = await client.call("gate", {"tag": "retry"}, meta=meta)
        again = await client.call("gate", {"tag": "retry"}, meta=meta)
        assert (first["resultType"], again["resultType"]) == ("task", "task")
        assert again["taskId"] == first["taskId"]
        open_gate(stack, "retry")
        await client.settled(first["taskId"])
        replayed = await client.call("gate", {"tag": "retry"}, meta=meta)
    assert replayed["resultType"] == "complete" and replayed["structuredContent"] == {"n": 1}
    assert replayed["_meta"]["carmy/execution_id"] == first["taskId"]
    assert replayed["_meta"]["carmy/replayed"] is True
    assert lines(stack.tmp / "gate-start-retry") == [first["taskId"]]  # the tool ran once


# --- the official Python SDK, through its extension hooks ----------------------------------------

class CreatedTask(Result):
    """A ``CreateTaskResult``, as the SDK's client parses a claimed ``tools/call`` answer."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class PolledTask(Result):
    """A ``tasks/get`` answer (``DetailedTask``), with the call's result once completed."""

    task_id: str
    status: str
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None


class TasksGet(Request[dict[str, Any], Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param: ClassVar[str | None] = "taskId"  # SEP-2663: Mcp-Name carries the task id


class TasksCancel(Request[dict[str, Any], Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param: ClassVar[str | None] = "taskId"


class PollingTasks(ClientExtension):
    """The tasks extension for the Python SDK's ``Client``, which has none of its own: it declares
    the extension on every request, and finishes a call answered with a task by polling it."""

    identifier = TASKS

    def __init__(self) -> None:
        self.polled: list[str] = []  # the tasks it was given, in order

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self._settle)]

    async def _settle(self, task: CreatedTask, ctx: ClaimContext) -> CallToolResult:
        self.polled.append(task.task_id)
        while True:
            polled = await ctx.session.send_request(TasksGet(params={"taskId": task.task_id}), PolledTask)
            if polled.status == "completed" and polled.result is not None:
                return CallToolResult.model_validate(polled.result)
            if polled.status not in ("working", "input_required"):
                raise RuntimeError(f"task {task.task_id} ended {polled.status}")
            await anyio.sleep(min(polled.poll_interval_ms or 1000, 50) / 1000)  # a test need not wait a second


@contextlib.asynccontextmanager
async def sdk_client(url: str, tasks: PollingTasks | None = None) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(10, read=60)) as http, \
            Client(streamable_http_client(url, http_client=http), extensions=[tasks or PollingTasks()]) as client:
        yield client


async def test_python_sdk_calls_through_a_task(url: str, stack: Stack) -> None:
    tasks = PollingTasks()
    async with sdk_client(url, tasks) as client, anyio.create_task_group() as calls:
        assert client.protocol_version == VERSION
        outcome: list[CallToolResult] = []

        async def call() -> None:
            outcome.append(await client.call_tool("gate", {"tag": "sdk"}))

        calls.start_soon(call)
        await until(lambda: _first(tasks.polled))  # the call became a task, which the client polls
        open_gate(stack, "sdk")
    (result,) = outcome
    assert not result.is_error and result.structured_content == {"n": 1}
    assert result.meta is not None and result.meta["carmy/execution_id"] == tasks.polled[0]
    assert lines(stack.tmp / "gate-start-sdk") == tasks.polled


async def _first(items: list[str]) -> str | None:
    return items[0] if items else None


async def test_python_sdk_creates_polls_and_cancels_a_task(url: str, stack: Stack) -> None:
    async with sdk_client(url) as client:
        created = await client.session.call_tool("gate", {"tag": "sdk-cancel"}, allow_claimed=True)
        assert isinstance(created, CreatedTask) and created.status == "working"
        polled = await client.session.send_request(TasksGet(params={"taskId": created.task_id}), PolledTask)
        assert (polled.task_id, polled.status) == (created.task_id, "working")
        assert await appears(stack.tmp / "gate-start-sdk-cancel", 10)  # running, not merely queued
        await client.session.send_request(TasksCancel(params={"taskId": created.task_id}), Result)
        assert await appears(stack.tmp / "gate-cancelled-sdk-cancel", 10)
        cancelled = await until(lambda: _ended(client, created.task_id))
    assert cancelled.status == "cancelled" and cancelled.result is None


async def _ended(client: Client, task_id: str) -> PolledTask | None:
    polled = await client.session.send_request(TasksGet(params={"taskId": task_id}), PolledTask)
    return polled if polled.status != "working" else None
