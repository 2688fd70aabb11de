"""/mcp driven by the official TypeScript MCP clients, as agents use them: each test gives a
scenario to a client script run by node (sdk_v1.mjs, client_v2.mjs) and asserts on what the
client got, as its user would see it, and on the tools' side effects, counted outside Redis.

* ``sdk_v1``: ``@modelcontextprotocol/sdk`` 1.32.2, the initialize handshake (2025-11-25). Its
  ``callTool`` checks ``structuredContent`` against the tool's outputSchema even on an error
  result (typescript-sdk#1943): an error result must carry none.
* ``client_v2``: ``@modelcontextprotocol/client`` 2.4.0, the stateless 2026-07-28 protocol.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.interop.conftest import TOKEN, Agent, running
from tests.support import Stack, wait_until

PROTOCOL = {"sdk_v1": "2025-11-25", "client_v2": "2026-07-28"}
MODERN = "client_v2"


@pytest.fixture(scope="module", params=list(PROTOCOL))
def agent(request: pytest.FixtureRequest, node: str, stack: Stack) -> Iterator[Agent]:
    with running(node, request.param, stack) as a:
        yield a


def result_of(answer: dict[str, Any]) -> dict[str, Any]:
    """The CallToolResult the client returned; the client throwing instead fails the test."""
    assert "thrown" not in answer, f"the client threw instead of returning the result: {answer['thrown']}"
    result: dict[str, Any] = answer["result"]
    return result


def tool_error(answer: dict[str, Any]) -> dict[str, Any]:
    """The carmy/1 error object of an error result, checking the result's shape."""
    result = result_of(answer)
    assert result["isError"] is True
    assert [c["type"] for c in result["content"]] == ["text"]
    err: dict[str, Any] = json.loads(result["content"][0]["text"])
    # Not structuredContent: it would be checked against the tool's outputSchema (sdk 1.x throws).
    assert "structuredContent" not in result
    meta = result["_meta"]
    assert meta["carmy/error"] == err
    assert meta["carmy/execution_id"].startswith("exec_")
    assert meta["carmy/replayed"] is False
    return err


def tools_of(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in answer["listed"]["tools"]}


def test_connect(agent: Agent, url: str) -> None:
    answer = agent.run("connect", url)
    assert answer["protocolVersion"] == PROTOCOL[agent.name]
    assert answer["serverVersion"]["name"] == "carmy"
    assert "tools" in answer["capabilities"]
    assert "carmy/request_id" in answer["instructions"]
    assert answer["errors"] == []


def test_tools_list(agent: Agent, url: str) -> None:
    answer = agent.run("list", url)
    assert answer["errors"] == []
    tools = tools_of(answer)
    assert list(tools) == sorted(tools)

    assert tools["wipe"]["annotations"] == {
        "readOnlyHint": False, "destructiveHint": True, "idempotentHint": True, "openWorldHint": False}
    assert tools["wipe"]["_meta"] == {
        "carmy/effect": "destructive", "carmy/confirmation": "required", "carmy/parallel_safe": False}
    echo = tools["echo"]
    assert echo["description"] == "Echo the text."
    assert echo["annotations"] == {
        "readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
    assert echo["_meta"] == {"carmy/effect": "read", "carmy/confirmation": "none", "carmy/parallel_safe": True}
    assert echo["inputSchema"]["type"] == "object" and echo["inputSchema"]["additionalProperties"] is False
    assert echo["outputSchema"]["type"] == "object"
    assert tools["notify"]["annotations"]["openWorldHint"] is True
    assert tools["publish"]["_meta"]["carmy/confirmation"] == "required"


@pytest.mark.parametrize("agent", [MODERN], indirect=True)  # ttlMs and cacheScope are 2026-07-28's
def test_tools_list_is_cacheable_for_a_minute(agent: Agent, url: str) -> None:
    """As GET /agent/tools' Cache-Control: private, max-age=60."""
    listed = agent.run("list", url)["listed"]
    assert (listed.get("ttlMs"), listed.get("cacheScope")) == (60000, "private")


def test_tool_title(agent: Agent, url: str) -> None:
    """The title given to @tool(title=...) (tests/toolsets/interop.py); 2025-06-18 has the field too."""
    tools = tools_of(agent.run("list", url))
    assert tools["skus"].get("title") == "List the SKUs"
    assert "title" not in tools["echo"]


@pytest.mark.parametrize("agent", [MODERN], indirect=True)  # a description is 2026-07-28's
def test_server_title_and_description(agent: Agent, url: str) -> None:
    info = agent.run("connect", url)["serverVersion"]
    assert info["title"] == "Carmy"
    assert "carmy/request_id" in info["description"]


def test_structured_result(agent: Agent, url: str) -> None:
    answer = agent.run("calls", url, calls=[{"name": "echo", "arguments": {"text": "ab", "times": 2}}])
    assert answer["errors"] == []
    result = result_of(answer["results"][0])
    assert result["isError"] is False
    assert result["structuredContent"] == {"text": "abab"}
    assert [json.loads(c["text"]) for c in result["content"]] == [{"text": "abab"}]
    assert result["_meta"]["carmy/execution_id"].startswith("exec_")
    assert result["_meta"]["carmy/replayed"] is False


def test_result_that_is_not_an_object(agent: Agent, url: str) -> None:
    """A list: structured content with its schema on 2026-07-28, text only before."""
    listed = tools_of(agent.run("list", url))["skus"]
    answer = agent.run("calls", url, calls=[{"name": "skus"}])
    assert answer["errors"] == []
    result = result_of(answer["results"][0])
    assert result["isError"] is False
    assert [json.loads(c["text"]) for c in result["content"]] == [["KB-01", "MS-02"]]
    if agent.name == MODERN:
        assert listed["outputSchema"]["type"] == "array"
        assert result["structuredContent"] == ["KB-01", "MS-02"]
    else:
        assert "outputSchema" not in listed
        assert "structuredContent" not in result


REFUSED = {"code": "OUT_OF_STOCK", "message": "Nothing left.", "category": "conflict", "recoverable": True,
           "retryable": True, "retry_after": 7, "suggested_action": "wait", "details": {"sku": "KB-01"}}


@pytest.mark.parametrize(("tool", "arguments", "code"), [
    ("refuse", {}, "OUT_OF_STOCK"),  # the tool's own error
    ("echo", {"text": 5}, "INVALID_ARGUMENTS"),  # refused by the API's schema check
    ("wipe", {}, "CONFIRMATION_REQUIRED"),  # destructive, and no key grants confirm:wipe
    ("sleepy", {"seconds": 5}, "TIMEOUT"),  # its timeout is 1 s
])
def test_tool_error_is_a_result_the_client_reads(agent: Agent, url: str, tool: str, arguments: dict[str, Any],
                                                 code: str) -> None:
    """Every tool has an outputSchema, so sdk 1.x checks each result against it."""
    answer = agent.run("calls", url, calls=[{"name": tool, "arguments": arguments}])
    err = tool_error(answer["results"][0])
    assert err["code"] == code
    if tool == "refuse":
        assert err == REFUSED
    assert answer["errors"] == []


def test_unknown_tool_is_invalid_params(agent: Agent, url: str) -> None:
    """a JSON-RPC error, which both clients throw."""
    answer = agent.run("calls", url, calls=[{"name": "no_such_tool", "arguments": {}}])
    thrown = answer["results"][0].get("thrown")
    assert thrown is not None, f"a result instead of a JSON-RPC error: {answer['results'][0]}"
    assert thrown["code"] == -32602
    assert "Unknown tool: no_such_tool" in thrown["message"]


def test_carmy_job(agent: Agent, url: str) -> None:
    """The system tool as the clients see it: listed read-only with an outputSchema; a job's view
    is structured content that schema admits (sdk 1.x checks, and throws if not); an unknown job
    is an error result the client returns, not a throw (typescript-sdk#1943)."""
    created = httpx.post(url.removesuffix("/mcp") + "/agent/jobs",
                         json={"tool": "echo", "arguments": {"text": "a"}, "delay_ms": 3_600_000})
    assert created.status_code == 202, created.text
    job_id = created.json()["job_id"]
    listed = tools_of(agent.run("list", url))["carmy_job"]
    answer = agent.run("calls", url, calls=[{"name": "carmy_job", "arguments": {"job_id": job_id}},
                                            {"name": "carmy_job", "arguments": {"job_id": "job_none"}}])
    assert answer["errors"] == []
    found, unknown = (result_of(a) for a in answer["results"])
    assert listed["annotations"]["readOnlyHint"] is True and listed["outputSchema"]["type"] == "object"
    assert found["isError"] is False
    assert found["structuredContent"]["job_id"] == job_id and found["structuredContent"]["status"] == "queued"
    assert unknown["isError"] is True and "structuredContent" not in unknown
    assert json.loads(unknown["content"][0]["text"])["code"] == "JOB_NOT_FOUND"


def test_progress_in_order(agent: Agent, url: str) -> None:
    answer = agent.run("progress", url, call={"name": "progress", "arguments": {"n": 3}})
    assert answer["errors"] == []
    assert result_of(answer)["structuredContent"] == {"n": 3}
    assert [(p["progress"], p.get("total"), p.get("message")) for p in answer["progress"]] == [
        (1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


def test_cancel_stops_the_tool_and_gets_no_response(agent: Agent, url: str, stack: Stack) -> None:
    """the user gives up (AbortSignal). The running tool is cancelled (else it runs
    20 s), and nothing comes back for the call: with sdk 1.x, a response would be reported as
    'Received a response for an unknown message ID'."""
    tag = f"interop-{agent.name}"
    command = agent.start("cancel", url, call={"name": "linger", "arguments": {"seconds": 20, "tag": tag}})
    assert agent.next(command)["event"] == "calling"
    wait_until(lambda: (stack.tmp / f"linger-start-{tag}").exists(), 30, what="the tool started")
    agent.send({"id": command, "abort": True})
    wait_until(lambda: (stack.tmp / f"linger-cancelled-{tag}").exists(), 10, what="the tool was cancelled")
    answer = agent.answer(command)

    assert "result" not in answer, f"the cancelled call returned {answer['result']}"
    assert "gave up" in answer["thrown"]["message"]  # the SDK rejects the call with the abort's reason
    stream = answer["stream"]
    assert stream["ended"] is True
    responses = [m for m in stream["messages"] if m.get("id") == stream["requestId"]]
    assert responses == [], "the server answered a cancelled call"
    assert answer["errors"] == []


def test_retry_with_request_id_replays(agent: Agent, url: str, stack: Stack) -> None:
    name = f"interop-{agent.name}"
    call = {"name": "tally", "arguments": {"name": name}, "meta": {"carmy/request_id": f"order-{agent.name}"}}
    answer = agent.run("calls", url, calls=[call, call])
    assert answer["errors"] == []
    first, again = (result_of(a) for a in answer["results"])
    assert first["structuredContent"] == again["structuredContent"] == {"n": 1}
    assert again["_meta"]["carmy/execution_id"] == first["_meta"]["carmy/execution_id"]
    assert (first["_meta"]["carmy/replayed"], again["_meta"]["carmy/replayed"]) == (False, True)
    assert len((stack.tmp / f"tally-{name}").read_text().splitlines()) == 1  # the tool ran once


def test_api_key(agent: Agent, keyed_url: str) -> None:
    answer = agent.run("calls", keyed_url, token=TOKEN, calls=[{"name": "whoami"}, {"name": "wipe"}])
    assert answer["errors"] == []
    who, wiped = (result_of(a) for a in answer["results"])
    assert who["structuredContent"]["principal"] == "alice"
    assert wiped["isError"] is False  # the key grants confirm:wipe


@pytest.mark.parametrize("token", [None, "wrong-token-0123456789"])
def test_api_key_refused(agent: Agent, keyed_url: str, token: str | None) -> None:
    answer = agent.run("connect", keyed_url, token=token)
    assert "thrown" in answer, "connected without a valid key"
    assert "401" in json.dumps(answer["thrown"])
