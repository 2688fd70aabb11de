"""One socket write per answer of known length, and for a stream's head and first event:
uvicorn's own request-response cycle, with ``OneWriteCycle`` installed as
``HardenedHttpToolsProtocol`` installs it, writing to a transport that records what reaches it."""

from __future__ import annotations

import asyncio
import logging

import pytest
from starlette.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from api.serving.onewrite import OneWriteCycle


class Recorded(asyncio.Transport):
    """What the cycle wrote, one entry per write, and whether it closed."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:  # type: ignore[override]
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def cycle(transport: Recorded, method: str = "POST") -> OneWriteCycle:
    made = RequestResponseCycle(
        scope={"type": "http", "method": method, "path": "/", "headers": []},  # type: ignore[typeddict-item]
        transport=transport, flow=FlowControl(transport), logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test"), access_log=False, default_headers=[],
        message_event=asyncio.Event(), expect_100_continue=False, keep_alive=True, on_response=lambda: None,
    )
    OneWriteCycle.install(made)
    assert isinstance(made, OneWriteCycle)
    made.more_body = False
    return made


async def run(app: ASGIApp, method: str = "POST") -> Recorded:
    transport = Recorded()
    await cycle(transport, method).run_asgi(app)  # type: ignore[arg-type]
    return transport


async def test_a_json_answer_is_one_write() -> None:
    transport = await run(Response(b'{"ok": true}', media_type="application/json"))
    [written] = transport.writes
    assert written.startswith(b"HTTP/1.1 200 OK\r\n") and written.endswith(b'\r\n\r\n{"ok": true}')


async def test_a_stream_whose_first_event_follows_its_head_at_once_is_one_write() -> None:
    async def stream(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"event: started\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"event: done\n\n"})

    transport = await run(stream)
    first, last = transport.writes
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in first
    assert first.endswith(b"\r\n\r\n10\r\nevent: started\n\n\r\n") and last == b"d\r\nevent: done\n\n\r\n0\r\n\r\n"


async def test_a_stream_has_its_head_written_before_a_first_event_that_comes_later() -> None:
    heads: list[list[bytes]] = []
    transport = Recorded()

    async def events() -> object:
        for _ in range(100):  # the first event waits for the loop to turn (a tool's progress, say)
            if transport.writes:
                break
            await asyncio.sleep(0)
        heads.append(transport.writes[:])  # what the client had before the first event
        yield b"data: 1\n\n"

    await cycle(transport).run_asgi(StreamingResponse(events(), media_type="text/event-stream"))  # type: ignore[arg-type]
    [[head]] = heads
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in head


async def test_the_head_of_a_head_request_is_written_when_the_answer_ends() -> None:
    transport = await run(Response(b"abc"), method="HEAD")
    [written] = transport.writes
    assert written.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 3\r\n" in written
    assert written.endswith(b"\r\n\r\n")


async def test_an_app_failing_after_the_head_still_sends_it_then_closes(caplog: pytest.LogCaptureFixture) -> None:
    async def failing(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        raise RuntimeError("after the head")

    with caplog.at_level(logging.CRITICAL, logger="test"):
        transport = await run(failing)
    [written] = transport.writes
    assert written.startswith(b"HTTP/1.1 200 OK\r\n") and transport.closed
