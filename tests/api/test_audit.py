"""``GET /agent/audit`` and MCP's ``carmy_audit`` in process, against the real Redis and one real
worker of ``tests.toolsets.basic``: the entries the worker writes as it settles the calls made
here, read by an operator newest first, a page at a time, filtered; refused parameters; who may
read the trail (operators only), and over MCP only when ``CARMY_MCP_OPERATOR_TOOLS`` is on.

Each test calls as principals of its own, and reads with a ``principal`` filter, so that the
entries of other tests in the module's Redis do not matter.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jsonschema_rs
import pytest
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette

from api.app import create_app
from api.settings import ApiKey, ApiSettings
from carmy_worker.store.jobstore import rfc3339
from tests.api.test_mcp_jobs import connect, tools_of
from tests.conftest import asgi_client
from tests.support import Proc, Stack, app_settings

OPS = "ops-token-0123456789abc"
AS_OPS = {"authorization": f"Bearer {OPS}"}
CALLERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace")
KEYS = {f"{name}-token-0123456789": ApiKey(principal=name) for name in CALLERS} | {
    OPS: ApiKey(principal="ops", permissions=frozenset({"carmy:operator"}))}
ENTRY_FIELDS = ["id", "execution_id", "request_id", "job_id", "principal", "tool", "effect", "status", "error_code",
                "duration_ms", "queued_ms", "started_at", "finished_at", "replayed", "via", "worker"]


def as_(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {name}-token-0123456789"}


@pytest.fixture(scope="module")
def api_settings(stack: Stack) -> ApiSettings:
    return app_settings(stack.redis_url, api_keys=KEYS, mcp_operator_tools=True)


async def call(client: httpx.AsyncClient, who: str, tool: str = "echo", request_id: str | None = None,
               **arguments: Any) -> str:
    """A call of ``tool`` as ``who``, answered (so its entry is written); its execution id."""
    body: dict[str, Any] = {"tool": tool, "arguments": arguments or ({"text": "hi"} if tool == "echo" else {})}
    if request_id is not None:
        body["request_id"] = request_id
    r = await client.post("/agent/execute", json=body, headers=as_(who))
    assert "execution_id" in r.json(), r.text
    exec_id: str = r.json()["execution_id"]
    return exec_id


async def audit(client: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    r = await client.get("/agent/audit", params=params, headers=AS_OPS)
    assert r.status_code == 200, r.text
    assert r.headers["cache-control"] == "no-store"
    page: dict[str, Any] = r.json()
    assert list(page) == ["entries", "next_cursor"]
    return page


def refusal(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    assert error["code"] == code, error
    return error


async def test_an_operator_reads_each_execution_newest_first(client: httpx.AsyncClient) -> None:
    before = int(time.time() * 1000)
    first = await call(client, "alice", request_id="audit-first")
    second = await call(client, "alice", "refuse")
    page = await audit(client, principal="alice")
    assert [e["execution_id"] for e in page["entries"]] == [second, first]
    assert page["next_cursor"] is None
    newest, oldest = page["entries"]
    assert list(oldest) == ENTRY_FIELDS
    assert {k: oldest[k] for k in ("request_id", "job_id", "principal", "tool", "effect", "status", "error_code",
                                   "replayed", "via")} == {
        "request_id": "audit-first", "job_id": None, "principal": "alice", "tool": "echo", "effect": "read",
        "status": "completed", "error_code": None, "replayed": False, "via": "http"}
    assert (newest["tool"], newest["status"], newest["error_code"]) == ("refuse", "failed", "OUT_OF_STOCK")
    assert oldest["worker"] and oldest["duration_ms"] >= 0 and oldest["queued_ms"] >= 0
    assert rfc3339(before - 1000) <= oldest["started_at"] <= oldest["finished_at"] <= newest["finished_at"]


async def test_pages_follow_the_cursor_to_the_end(client: httpx.AsyncClient) -> None:
    made = [await call(client, "bob", text=str(i)) for i in range(5)]
    seen, cursor, pages = [], None, 0
    while True:
        page = await audit(client, principal="bob", limit=2, **({"cursor": cursor} if cursor else {}))
        pages += 1
        assert len(page["entries"]) <= 2
        seen += [e["execution_id"] for e in page["entries"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == made[::-1] and pages == 3


async def test_each_filter_narrows_the_trail(client: httpx.AsyncClient) -> None:
    echoed = await call(client, "carol")
    nothing = await call(client, "carol", "noop")
    failed = await call(client, "carol", "refuse")
    await call(client, "dave")

    async def ids(**params: Any) -> list[str]:
        return [e["execution_id"] for e in (await audit(client, **params))["entries"]]

    assert await ids(principal="carol") == [failed, nothing, echoed]
    assert await ids(principal="carol", tool="noop") == [nothing]
    assert await ids(principal="carol", status="failed") == [failed]
    assert await ids(principal="carol", status="cancelled") == []
    assert set(await ids(tool="echo", limit=500)) >= {echoed}
    assert nothing not in await ids(tool="echo", limit=500)
    assert await ids(principal="carol", tool="") == [failed, nothing, echoed]  # sent empty: no filter


async def test_since_and_until_bound_the_time_in_ms_or_rfc_3339(client: httpx.AsyncClient) -> None:
    early = await call(client, "erin")
    time.sleep(0.02)
    page = await audit(client, principal="erin")
    cut = int(page["entries"][0]["id"].split("-")[0]) + 10  # after the first entry was written
    time.sleep(0.03)
    late = await call(client, "erin")

    async def ids(**params: Any) -> list[str]:
        return [e["execution_id"] for e in (await audit(client, principal="erin", **params))["entries"]]

    assert await ids(since=cut) == [late]
    assert await ids(until=cut) == [early]
    assert await ids(since=rfc3339(cut)) == [late]
    assert await ids(since=rfc3339(cut).replace("T", "t").replace("Z", "z")) == [late]  # RFC 3339 allows both
    assert await ids(until=rfc3339(cut).replace("Z", "+00:00")) == [early]
    assert await ids(since=cut - 60_000, until=cut + 60_000) == [late, early]
    # A "+" sent unencoded in a query string arrives as a space: still the offset it was.
    plus_one = datetime.datetime.fromtimestamp(cut / 1000, datetime.timezone(datetime.timedelta(hours=1)))
    r = await client.get(f"/agent/audit?principal=erin&since={plus_one.isoformat(timespec='milliseconds')}",
                         headers=AS_OPS)
    assert [e["execution_id"] for e in r.json()["entries"]] == [late], r.text


@pytest.mark.parametrize(("params", "field"), [
    ({"limit": "0"}, "limit"), ({"limit": "501"}, "limit"), ({"limit": "ten"}, "limit"), ({"limit": "-1"}, "limit"),
    ({"status": "succeeded"}, "status"), ({"since": "yesterday"}, "since"), ({"since": "2026-12-02"}, "since"),
    ({"until": "2026-12-02T10:00:00"}, "until"), ({"until": "9" * 16}, "until"),
    # ISO 8601 forms that are not RFC 3339's (Python's fromisoformat reads them).
    ({"since": "20261202T100000Z"}, "since"), ({"until": "2026-12-02T10:00Z"}, "until"),
    ({"since": "2026-W49-3T10:00:00Z"}, "since"), ({"since": "2026-12-02T10:00:00+0100"}, "since"),
    ({"since": "2000", "until": "1000"}, "until"), ({"cursor": "abc"}, "cursor"), ({"cursor": "1-2-3"}, "cursor"),
    # Digits to str.isdigit() that int() refuses (a 500): a cursor is ASCII digits.
    ({"cursor": "\u00b2-0"}, "cursor"), ({"cursor": "0-\u00b2"}, "cursor"),
])
async def test_a_bad_parameter_is_refused_naming_it(client: httpx.AsyncClient, params: dict[str, str],
                                                    field: str) -> None:
    r = await client.get("/agent/audit", params=params, headers=AS_OPS)
    assert refusal(r, 400, "INVALID_REQUEST")["details"]["field"] == field
    assert r.headers["cache-control"] == "no-store"


async def test_only_operators_read_the_trail(client: httpx.AsyncClient) -> None:
    await call(client, "frank")
    refusal(await client.get("/agent/audit", headers=as_("frank")), 403, "OPERATOR_REQUIRED")
    # Not looked at before the caller is: a non-operator learns nothing from its parameters.
    refusal(await client.get("/agent/audit", params={"limit": "x"}, headers=as_("frank")), 403, "OPERATOR_REQUIRED")
    r = await client.get("/agent/audit")
    refusal(r, 401, "UNAUTHENTICATED")
    assert r.headers["www-authenticate"].startswith("Bearer")


async def test_without_authentication_nobody_is_an_operator(worker: Proc, stack: Stack) -> None:
    """As the jobs' operator routes: an API without keys has anonymous callers, with no permissions."""
    async with asgi_client(create_app(app_settings(stack.redis_url))) as open_client:
        refusal(await open_client.get("/agent/audit"), 403, "OPERATOR_REQUIRED")


@pytest.mark.slow
async def test_redis_out_of_reach_is_store_unavailable() -> None:
    async with asgi_client(create_app(app_settings(api_keys=KEYS))) as client:  # nothing listens at its Redis
        r = await client.get("/agent/audit", headers=AS_OPS)
    refusal(r, 503, "STORE_UNAVAILABLE")


# --- MCP -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def closed_app(stack: Stack, worker: Proc) -> AsyncIterator[Starlette]:
    """CARMY_MCP_OPERATOR_TOOLS off (the default)."""
    a = create_app(app_settings(stack.redis_url, api_keys=KEYS))
    async with a.router.lifespan_context(a):
        yield a


@pytest.mark.parametrize(("opted_in", "token", "listed"), [(True, OPS, True), (True, "grace-token-0123456789", False),
                                                          (False, OPS, False)])
async def test_carmy_audit_is_listed_for_operators_when_opted_in(
        asgi_app: Starlette, client: httpx.AsyncClient, closed_app: Starlette, opted_in: bool, token: str,
        listed: bool) -> None:
    async with connect(asgi_app if opted_in else closed_app, token) as mcp:
        tools = tools_of((await mcp.list_tools()).tools)
        if not listed:
            with pytest.raises(MCPError) as refused:
                await mcp.call_tool("carmy_audit", {})
    assert ("carmy_audit" in tools) is listed
    if not listed:
        assert refused.value.error.code == -32602
        assert refused.value.error.message == "Unknown tool: carmy_audit"


async def test_carmy_audit_answers_a_page_with_its_filters(asgi_app: Starlette, client: httpx.AsyncClient) -> None:
    made = [await call(client, "grace", text=str(i)) for i in range(3)]
    async with connect(asgi_app, OPS) as mcp:
        tool = tools_of((await mcp.list_tools()).tools)["carmy_audit"]
        first = await mcp.call_tool("carmy_audit", {"principal": "grace", "limit": 2})
        cursor = (first.structured_content or {})["next_cursor"]
        rest = await mcp.call_tool("carmy_audit", {"principal": "grace", "cursor": cursor})
        bad = await mcp.call_tool("carmy_audit", {"principal": "grace", "since": "soon"})
        out_of_range = await mcp.call_tool("carmy_audit", {"limit": 501})
    assert tool.annotations is not None and tool.annotations.read_only_hint is True
    assert tool.input_schema["properties"].keys() == {"tool", "principal", "status", "since", "until", "limit",
                                                      "cursor"}
    assert tool.output_schema is not None
    pages = []
    for result in (first, rest):
        assert not result.is_error, result
        assert result.structured_content == json.loads(result.content[0].text)
        jsonschema_rs.validator_for(tool.output_schema).validate(result.structured_content)
        assert "carmy/execution_id" not in (result.meta or {})  # answered by the API: no execution
        pages.append([e["execution_id"] for e in (result.structured_content or {})["entries"]])
    assert pages == [made[:0:-1], made[:1]]
    assert (rest.structured_content or {})["next_cursor"] is None
    assert bad.is_error and json.loads(bad.content[0].text)["details"] == {"field": "since"}
    assert out_of_range.is_error and json.loads(out_of_range.content[0].text)["code"] == "INVALID_ARGUMENTS"


async def test_an_mcp_call_leaves_its_entry_by_that_door(asgi_app: Starlette, client: httpx.AsyncClient) -> None:
    async with connect(asgi_app, "grace-token-0123456789") as mcp:
        result = await mcp.call_tool("echo", {"text": "over mcp"})
    exec_id = (result.meta or {})["carmy/execution_id"]
    entries = (await audit(client, principal="grace", tool="echo"))["entries"]
    assert [(e["execution_id"], e["via"]) for e in entries if e["execution_id"] == exec_id] == [(exec_id, "mcp")]

