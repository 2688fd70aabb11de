"""Answering one execution: wait for its record (JSON) or relay its events (SSE), and cancel
it if the caller goes away first. Both watch for the disconnect while waiting, not only when
writing, so a vanished caller is noticed within milliseconds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from api.calling.executions import Executions
from api.events.mailbox import Mailbox
from api.serving.departure import Departed, Departure
from carmy_worker.loop import first_done, running_loop
from carmy_worker.wire import SSE_KEEPALIVE, Event, Record, sse_completed, sse_frame, sse_started

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),  # tell proxies not to buffer the stream
]


async def until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def race_disconnect(work: Coroutine[Any, Any, Record], receive: Receive,
                          on_disconnect: Callable[[], Awaitable[None]] | None) -> Record | None:
    """Run ``work``; if the client disconnects first, stop it and call ``on_disconnect``.

    ``on_disconnect`` (the cancel of the execution) is called as soon as the disconnect is seen,
    without waiting for ``work`` to unwind, and runs to its end even if this call is cancelled
    meanwhile: however long ``work`` takes to stop, or if it swallows a cancellation, the
    execution is cancelled all the same. ``work`` is cancelled again and again until it has
    stopped, as a cancel scope would.

    Returns what ``work`` returned (the record it answered with), or None if the client left.
    An error of ``work`` is raised as itself, unless the client had left.

    Two plain asyncio tasks and a future that the first to end completes: this runs once per
    call, and an anyio task group cost several times as much CPU (a tenth of the API's under
    load), ``asyncio.wait`` twice as much.
    """
    loop = running_loop()
    answering = loop.create_task(work)
    watching = loop.create_task(until_disconnect(receive))
    try:
        await first_done(answering, watching)
        # A complete response also ends receive(): that is not a departure.
        if answering.done():
            return answering.result()
        watching.result()  # an error of receive() is raised as itself (the work is stopped first)
        answering.cancel()  # stop the work, but do not wait for it to stop
        if on_disconnect is not None:
            await _to_its_end(on_disconnect())
        return None
    finally:
        watching.cancel()
        await _stopped(answering)


async def _to_its_end(work: Awaitable[None]) -> None:
    """``await work``, which goes on to its end even if this call is cancelled meanwhile."""
    running = asyncio.ensure_future(work)
    _detached.add(running)  # kept until done
    running.add_done_callback(_detached.discard)
    await asyncio.shield(running)


_detached: set[asyncio.Future[None]] = set()
RECANCEL_S = 0.01  # how often a work that swallowed its cancellation is cancelled again


async def _stopped(task: asyncio.Future[Record]) -> None:
    """Until ``task`` has ended, cancelling it (again) while it runs on; its outcome is dropped."""
    while not task.done():
        task.cancel()
        try:
            await asyncio.wait((task,), timeout=RECANCEL_S)
        except asyncio.CancelledError:
            task.cancel()
            raise
    if not task.cancelled():
        task.exception()  # retrieved: an error of a work nobody waits for any more is not reported twice


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


async def answer_json(send: Send, executions: Executions, exec_id: str, tool: str, messages: Mailbox) -> Record:
    """Wait for the record, then send it as the JSON response."""
    record = await executions.outcome(exec_id, tool, messages)
    await send_json(send, record)
    return record


async def answer_json_unless_gone(send: Send, executions: Executions, exec_id: str, tool: str, messages: Mailbox,
                                  departure: Departure, on_disconnect: Callable[[], Awaitable[None]] | None,
                                  ) -> Record | None:
    """``race_disconnect(answer_json(...))`` for a request whose server sets its ``Departure``
    (``api/serving/departure.py``): the record and the client's departure are waited for on one future,
    in this task. Returns the record it answered with, or None if the client left first (then
    ``on_disconnect`` runs, to its end even if this call is cancelled meanwhile)."""
    try:
        record = await executions.outcome(exec_id, tool, messages, until=departure)
    except Departed:
        await _left(on_disconnect)
        return None
    await send_json(send, record)
    return record


async def _left(on_disconnect: Callable[[], Awaitable[None]] | None) -> None:
    """The client left: ``on_disconnect`` runs to its end, even if this call is cancelled meanwhile."""
    if on_disconnect is not None:
        await _to_its_end(on_disconnect())


class SseStream:
    """One execution's events as a ``text/event-stream`` response, keep-alives included.

    A client that reads more slowly than its tool reports progress has old progress events
    dropped from its mailbox (``api.events.mailbox``): the next frame it gets is preceded by the
    comment ``: dropped <n> tool.progress events``.

    Frames go out together when their events came together: a frame is held while the mailbox
    already has the next event waiting (relayed in the same turn of the loop, with no wait in
    between), and written with the frames after it, ``execution.completed`` included. One write
    per burst instead of one per frame: the ``tool.started`` that reaches the API before SUBMIT's
    reply goes out with ``execution.started``, ``tool.completed`` with ``execution.completed``.
    """

    def __init__(self, send: Send, messages: Mailbox, *, keepalive: float) -> None:
        self._send = send
        self._messages = messages
        self._keepalive = keepalive
        self._last_write = time.monotonic()
        self._held = b""  # frames to go out with the next one

    async def start(self, exec_id: str, tool: str) -> None:
        await self._send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await self._write_or_hold(sse_started(exec_id, tool))

    async def event(self, event: Event) -> None:
        await self._write_or_hold(self._dropped() + sse_frame(event.name, event.data))

    async def idle(self) -> None:
        if time.monotonic() - self._last_write >= self._keepalive:
            await self._write(SSE_KEEPALIVE)

    async def finish(self, record: Record, *, replayed: bool) -> None:
        body = self._held + self._dropped() + sse_completed(record, replayed=replayed)
        self._held = b""
        await self._send({"type": "http.response.body", "body": body})

    def _dropped(self) -> bytes:
        dropped = self._messages.take_dropped()
        return b": dropped %d tool.progress events\n\n" % dropped if dropped else b""

    async def _write_or_hold(self, chunk: bytes) -> None:
        if self._messages.has_event_waiting():
            self._held += chunk
        else:
            await self._write(chunk)

    async def _write(self, chunk: bytes) -> None:
        chunk, self._held = self._held + chunk, b""
        await self._send({"type": "http.response.body", "body": chunk, "more_body": True})
        self._last_write = time.monotonic()


class EarlyStream:
    """An SSE call's stream, begun as soon as its SUBMIT has left for Redis (``Calls.start``'s
    ``announce``): ``execution.started`` then goes out while Redis creates the execution and a
    worker takes it, rather than after SUBMIT's reply. Its head and first frame are written from
    the call's own task, in one write, as ``stream_sse`` writes them."""

    __slots__ = ("execution_id", "keepalive", "send", "stream", "tool")

    def __init__(self, send: Send, tool: str, *, keepalive: float) -> None:
        self.send = send
        self.tool = tool
        self.keepalive = keepalive
        self.stream: SseStream | None = None  # once begun
        self.execution_id = ""

    async def __call__(self, exec_id: str, messages: Mailbox | None) -> None:
        if messages is None:  # pragma: no cover - announced only to a followed call
            raise RuntimeError("an SSE stream without its subscription")
        stream = SseStream(self.send, messages, keepalive=self.keepalive)
        self.stream, self.execution_id = stream, exec_id
        await stream.start(exec_id, self.tool)


async def stream_sse(send: Send, executions: Executions, exec_id: str, tool: str, messages: Mailbox,
                     *, replayed: bool, keepalive: float, until: Departure | None = None,
                     begun: SseStream | None = None) -> Record:
    """Relay the execution's events as they come, ending with ``execution.completed``;
    ``Departed`` once ``until`` is set (see ``stream_sse_unless_gone``). ``begun``: the stream
    whose head and ``execution.started`` went out already (``EarlyStream``)."""
    stream = begun
    if stream is None:
        stream = SseStream(send, messages, keepalive=keepalive)
        await stream.start(exec_id, tool)
    record = await executions.outcome(exec_id, tool, messages, tick=keepalive, on_event=stream.event,
                                      on_idle=stream.idle, until=until)
    await stream.finish(record, replayed=replayed)
    return record


async def stream_sse_unless_gone(send: Send, executions: Executions, exec_id: str, tool: str, messages: Mailbox,
                                 departure: Departure, on_disconnect: Callable[[], Awaitable[None]] | None,
                                 *, replayed: bool, keepalive: float, begun: SseStream | None = None,
                                 ) -> Record | None:
    """``race_disconnect(stream_sse(...))`` for a request whose server sets its ``Departure``, as
    ``answer_json_unless_gone`` is for JSON: the stream is written from this task, so its first
    frame goes out as soon as the call is accepted (no task to start first), and its events and
    the client's departure are waited for on one future. Returns the record it ended with, or
    None if the client left first (then ``on_disconnect`` runs, to its end)."""
    try:
        return await stream_sse(send, executions, exec_id, tool, messages, replayed=replayed, keepalive=keepalive,
                                until=departure, begun=begun)
    except Departed:
        await _left(on_disconnect)
        return None


async def send_sse_record(send: Send, exec_id: str, tool: str, record: Record, *, replayed: bool) -> None:
    """A stream of two events: for replays and for calls refused before reaching a worker."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    body = sse_started(exec_id, tool) + sse_completed(record, replayed=replayed)
    await send({"type": "http.response.body", "body": body})
