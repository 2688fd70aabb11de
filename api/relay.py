"""Answering one execution: wait for its record (JSON) or relay its events (SSE), and cancel
it if the caller goes away first. Both watch for the disconnect while waiting, not only when
writing, so a vanished caller is noticed within milliseconds."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from carmy_worker.wire import Event, Record, json_encoder

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),  # tell proxies not to buffer the stream
]


def frame(name: str, data: bytes) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


def completed_frame(record: Record, *, replayed: bool) -> bytes:
    """``execution.completed``: the result body plus ``replayed``."""
    suffix = b',"replayed":true}' if replayed else b',"replayed":false}'
    return frame("execution.completed", record.body[:-1] + suffix)


def started_frame(exec_id: str, tool: str) -> bytes:
    return frame("execution.started", json_encoder.encode({"execution_id": exec_id, "tool": tool}))


async def until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def race_disconnect(work: Awaitable[Record | None], receive: Receive,
                          on_disconnect: Callable[[], Awaitable[None]] | None) -> Record | None:
    """Run ``work``; if the client disconnects first, stop it and call ``on_disconnect``.

    Returns what ``work`` returned (the record it answered with), or None if the client left.
    """
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(until_disconnect(receive))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, gone):
            t.cancel()
    if task.done() and not task.cancelled():
        with contextlib.suppress(OSError):
            return task.result()
        return None
    with contextlib.suppress(asyncio.CancelledError, OSError):
        await task
    if on_disconnect is not None:
        await asyncio.shield(on_disconnect())
    return None


async def send_json(send: Send, record: Record) -> None:
    headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store"),
               (b"content-length", str(len(record.body)).encode())]
    if record.retry_after is not None:
        headers.append((b"retry-after", str(record.retry_after).encode()))
    await send({"type": "http.response.start", "status": record.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": record.body})


class RecordResponse(Response):
    """A record as a Starlette response, for endpoints (polling, DELETE) that return one."""

    def __init__(self, record: Record) -> None:
        super().__init__()
        self.record = record

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, self.record)


async def answer_json(send: Send, events: AsyncIterator[Event | Record | None]) -> Record | None:
    async for item in events:
        if isinstance(item, Record):
            await send_json(send, item)
            return item
    return None


async def stream_sse(send: Send, first: bytes, events: AsyncIterator[Event | Record | None], *,
                     replayed: bool, keepalive: float) -> Record | None:
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    await send({"type": "http.response.body", "body": first, "more_body": True})
    last_write = time.monotonic()
    async for item in events:
        if item is None:
            if time.monotonic() - last_write < keepalive:
                continue
            chunk = b": keep-alive\n\n"
        elif isinstance(item, Record):
            await send({"type": "http.response.body", "body": completed_frame(item, replayed=replayed)})
            return item
        else:
            chunk = frame(item.name, item.data)
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        last_write = time.monotonic()
    return None


async def send_sse_record(send: Send, exec_id: str, tool: str, record: Record, *, replayed: bool) -> None:
    """A stream of two events: for replays and for calls refused before reaching a worker."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    await send({"type": "http.response.body",
                "body": started_frame(exec_id, tool) + completed_frame(record, replayed=replayed)})
