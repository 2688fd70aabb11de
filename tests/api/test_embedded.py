"""The app mounted inside a host Starlette app, with host middleware supplying the context."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from api import create_app
from api.settings import ApiSettings
from carmy_worker import AgentContext


class TrustedContext:
    """What a host's auth middleware would do: turn its own session into an AgentContext."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"x-host-user") == b"alice":
                scope["carmy.context"] = AgentContext(
                    principal="alice", session="s-1", permissions=frozenset({"confirm:wipe"}),
                    metadata={"plan": "pro"},
                )
        await self.app(scope, receive, send)


def host_app(settings: ApiSettings) -> Starlette:
    carmy = create_app(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with carmy.router.lifespan_context(carmy):  # a mounted app gets no lifespan of its own
            yield

    host = Starlette(
        routes=[Route("/", lambda r: PlainTextResponse("host")), Mount("/carmy", app=carmy)],
        lifespan=lifespan,
    )
    host.add_middleware(TrustedContext)
    return host


@pytest.fixture(scope="module")
def asgi_app(api_settings: ApiSettings) -> Starlette:
    """The host app, with Carmy mounted at /carmy."""
    return host_app(api_settings)


async def test_host_routes_still_work(client: httpx.AsyncClient) -> None:
    assert (await client.get("/")).text == "host"
    assert (await client.get("/carmy/.well-known/agent")).json()["protocol"] == "carmy/1"


async def test_host_context_grants_confirmation(client: httpx.AsyncClient) -> None:
    refused = await client.post("/carmy/agent/execute", json={"tool": "wipe"})
    assert refused.status_code == 403
    granted = await client.post("/carmy/agent/execute", json={"tool": "wipe"}, headers={"x-host-user": "alice"})
    assert granted.status_code == 200, granted.text
    assert granted.json()["data"] == {"n": 0}


async def test_tool_sees_the_host_context(client: httpx.AsyncClient) -> None:
    r = await client.post("/carmy/agent/execute", json={"tool": "whoami", "request_id": "q1"},
                          headers={"x-host-user": "alice"})
    assert r.json()["data"] == {"principal": "alice", "session": "s-1", "permissions": ["confirm:wipe"],
                                "request_id": "q1"}


async def test_the_links_an_agent_follows_stay_under_the_mount(client: httpx.AsyncClient) -> None:
    """Discovery's links and every Location name ``/carmy/...``: without the mount's prefix, an
    agent that follows one reaches the host app (404), not Carmy."""
    discovery = (await client.get("/carmy/.well-known/agent")).json()
    assert (discovery["tools_url"], discovery["execute_url"], discovery["mcp_url"], discovery["jobs_url"]) == (
        "/carmy/agent/tools", "/carmy/agent/execute", "/carmy/mcp", "/carmy/agent/jobs")
    assert (await client.get(discovery["tools_url"])).status_code == 200

    accepted = await client.post(discovery["execute_url"], json={"tool": "sleepy", "arguments": {"seconds": 0.2}},
                                 headers={"prefer": "respond-async"})
    assert accepted.status_code == 202, accepted.text
    assert accepted.headers["location"] == f"/carmy/agent/executions/{accepted.json()['execution_id']}"
    assert (await client.get(accepted.headers["location"])).status_code in (200, 202)

    job = await client.post(discovery["jobs_url"], json={"tool": "echo", "arguments": {"text": "a"},
                                                          "delay_ms": 3_600_000})
    assert job.status_code == 202, job.text
    assert job.headers["location"] == f"/carmy/agent/jobs/{job.json()['job_id']}"
    assert (await client.get(job.headers["location"])).json()["status"] == "queued"
    assert (await client.delete(job.headers["location"])).json()["status"] == "cancelled"


async def test_discovery_at_the_servers_root_is_unchanged(api_settings: ApiSettings) -> None:
    """The same app served at the root hands out the links it always did."""
    app = create_app(api_settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as plain:
            discovery = (await plain.get("/.well-known/agent")).json()
    assert (discovery["tools_url"], discovery["execute_url"], discovery["mcp_url"]) == (
        "/agent/tools", "/agent/execute", "/mcp")
