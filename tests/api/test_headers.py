"""``api.guards.headers`` in process: what ``wrap`` turns on, and that it never holds a stream back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Message

from api.guards.headers import wrap
from api.settings import ApiSettings
from tests.support import app_settings

ORIGIN = "https://app.example"


async def hello(request: Request) -> Response:
    return PlainTextResponse("hello")


async def own_policy(request: Request) -> Response:
    return PlainTextResponse("framed", headers={"content-security-policy": "frame-ancestors 'self'"})


APP = Starlette(routes=[Route("/", hello), Route("/own", own_policy)])


def client(settings: ApiSettings) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=wrap(APP, settings)), base_url="http://carmy.test")


def test_nothing_is_wrapped_by_default() -> None:
    assert wrap(APP, app_settings()) is APP


async def test_a_header_the_app_sets_is_kept() -> None:
    async with client(app_settings(security_headers=True)) as c:
        r = await c.get("/own")
    assert r.headers.get_list("content-security-policy") == ["frame-ancestors 'self'"]
    assert r.headers["x-frame-options"] == "DENY"


async def test_cors_without_security_headers() -> None:
    async with client(app_settings(cors_origins=(ORIGIN,))) as c:
        r = await c.get("/", headers={"origin": ORIGIN})
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "x-content-type-options" not in r.headers


async def test_streams_pass_through_unbuffered() -> None:
    release = asyncio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"event: first\n\n"
        await release.wait()
        yield b"event: last\n\n"

    async def stream(request: Request) -> Response:
        return StreamingResponse(chunks(), media_type="text/event-stream")

    app = wrap(Starlette(routes=[Route("/", stream)]), app_settings(security_headers=True, cors_origins=(ORIGIN,)))
    sent: list[Message] = []
    first_body = asyncio.Event()

    async def receive() -> Message:
        await asyncio.Event().wait()  # the client never disconnects
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)
        if message.get("body"):
            first_body.set()

    scope = {"type": "http", "method": "GET", "path": "/", "raw_path": b"/", "query_string": b"",
             "headers": [(b"origin", ORIGIN.encode())], "http_version": "1.1", "scheme": "http",
             "server": ("carmy.test", 80), "client": ("127.0.0.1", 1), "root_path": ""}
    task = asyncio.create_task(app(scope, receive, send))
    # The first event reaches the client while the stream is still open.
    await asyncio.wait_for(first_body.wait(), 2)
    assert (b"x-content-type-options", b"nosniff") in sent[0]["headers"]
    assert (b"access-control-allow-origin", ORIGIN.encode()) in sent[0]["headers"]
    release.set()
    await asyncio.wait_for(task, 2)
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
