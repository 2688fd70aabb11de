"""``POST /agent/execute``: decode, resolve, check, submit, answer.

Written as a plain ASGI app rather than a Starlette endpoint so that it can read the body with
its own limit and keep listening for the client's disconnect while the tool runs.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redis.exceptions import RedisError
from starlette.types import Message, Receive, Scope, Send

from api.calling.calls import Calls, Started
from api.calling.catalog import CatalogTool
from api.calling.checks import Rejected
from api.endpoints import relay
from api.endpoints.deferred import Deferred
from api.endpoints.lookup import accepted
from api.endpoints.ops import ApiMetrics
from api.events.hub import HubUnavailable
from api.guards.auth import trusted_context
from api.guards.body import BodyTooLarge, ClientGone, read_body
from api.http import bodies
from api.http.fields import fields, header
from api.http.responses import envelope_error
from api.serving import departure
from api.settings import ApiSettings
from carmy_worker.logs import info_line, request_id_hash
from carmy_worker.sdk.errors import clip, store_unavailable
from carmy_worker.store import keys, records
from carmy_worker.wire import ErrorBody, ExecuteRequest, Record, request_decoder

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from carmy_worker.tracing import Tracing

log = logging.getLogger("carmy.api")


def wants_sse(scope: Scope) -> bool:
    accept = fields(scope).get(b"accept")  # media types are case-insensitive (RFC 9110, 8.3.1)
    return accept is not None and b"text/event-stream" in accept.lower()


def prefers_async(scope: Scope) -> bool:
    """``Prefer: respond-async`` (RFC 7240), among any other preferences."""
    prefer = fields(scope).get(b"prefer")
    return prefer is not None and any(p.split(b";")[0].strip().lower() == b"respond-async"
                                      for p in prefer.split(b","))


def decode_envelope(body: bytes) -> ExecuteRequest | str:
    """The request, or the reason it is malformed (which may quote the caller: an unknown field's name)."""
    return bodies.decode(request_decoder, body)


@dataclass
class Answer:
    """What one execute request was answered with: for the request log and the metrics."""

    outcome: str  # completed, failed, refused, replayed, joined, accepted, disconnected, invalid
    status_code: int
    tool: str | None = None
    execution_id: str | None = None
    error_code: str | None = None
    request_id: str | None = None

    @classmethod
    def of(cls, outcome: str, record: Record | None, execution_id: str, request: ExecuteRequest) -> Answer:
        if record is None:
            return cls(outcome, 499, request.tool, execution_id, None, request.request_id)
        if outcome == "answered":
            outcome = "completed" if record.status == "completed" else "failed"
        return cls(outcome, record.status_code, record.tool, execution_id, record.error_code, request.request_id)


class ExecuteEndpoint:
    def __init__(self, *, settings: ApiSettings, calls: Calls, metrics: ApiMetrics,
                 tracing: Tracing | None = None) -> None:
        self.settings = settings
        self.tracing = tracing  # None: tracing is off, and no span is made
        self.calls = calls
        self.executions = calls.executions
        self.metrics = metrics
        # Request log lines, written together a little later (api/endpoints/deferred.py says why).
        self.log_lines = Deferred()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        self.metrics.in_flight.inc()
        span, traceparent = None, None
        if self.tracing is not None:
            span = self.tracing.start("POST /agent/execute", header(scope, b"traceparent"), {
                "http.request.method": "POST", "url.path": scope["path"]}, server=True)
            traceparent = self.tracing.traceparent(span)
            send = _with_traceparent(send, traceparent.encode())
        answer: Answer | None = None
        try:
            answer = await self._handle(scope, receive, send, traceparent)
        finally:
            self.metrics.in_flight.dec()
            if span is not None:
                _end(span, answer)
        self.metrics.responded(answer.status_code, answer.outcome)
        if log.isEnabledFor(logging.INFO):
            self.log_lines.defer(_log_request, answer, round((time.perf_counter() - start) * 1000, 1))

    async def _handle(self, scope: Scope, receive: Receive, send: Send, traceparent: str | None = None) -> Answer:
        try:
            body = await read_body(scope, receive, self.settings.max_body)
        except BodyTooLarge:
            await envelope_error("PAYLOAD_TOO_LARGE", f"The body exceeds {self.settings.max_body} bytes.")(
                scope, receive, send)
            return Answer("invalid", 413, error_code="PAYLOAD_TOO_LARGE")
        except ClientGone:
            gone = departure.of(scope)
            if gone is not None and gone.body_timeout:  # the server answered 408 itself
                return Answer("invalid", 408, error_code="BODY_TIMEOUT")
            return Answer("disconnected", 499)
        request = decode_envelope(body)
        if isinstance(request, str):
            await envelope_error("INVALID_REQUEST", "The request body is not a valid execute request.",
                                 reason=request)(scope, receive, send)
            return Answer("invalid", 400, error_code="INVALID_REQUEST")
        return await self.call(request, (scope, receive, send), sse=wants_sse(scope),
                               respond_async=prefers_async(scope), traceparent=traceparent)

    async def call(self, request: ExecuteRequest, asgi: tuple[Scope, Receive, Send], *, sse: bool = False,
                   respond_async: bool = False, traceparent: str | None = None, via: str = "") -> Answer:
        """Run a decoded call for the caller of ``scope`` and answer it as ``POST /agent/execute``
        does: also the door of a webhook delivery (``api.endpoints.webhooks``), JSON only.
        ``via``: the door, for the audit trail (by default ``sse`` or ``http``, as it answers)."""
        scope, receive, send = asgi
        agent = trusted_context(scope)
        early: relay.EarlyStream | None = None
        try:
            call = self.calls.admit(request.tool, request.arguments, request.request_id, agent)
            tool = call.tool
            if sse and not respond_async:  # its stream begins once SUBMIT has left (Calls.start)
                early = relay.EarlyStream(send, tool.spec.name, keepalive=self.settings.sse_keepalive)
            async with self.calls.start(tool, call.arguments, call.request_id, agent,
                                        follow=not respond_async, stream=sse, traceparent=traceparent,
                                        via=via or ("sse" if sse else "http"), announce=early) as started:
                if started.record is not None:
                    return await self._replay(request, started.execution_id, started.record, sse, send)
                if respond_async:
                    return await self._accepted(request, started, (scope, receive, send))
                return await self._follow(request, started, tool, sse, (scope, receive, send),
                                          early.stream if early is not None else None)
        except Rejected as rejected:
            return await self._refuse(request, rejected.error, sse, send, early)
        except (RedisError, HubUnavailable, OSError) as exc:
            log.warning("store unavailable: %s", exc)
            return await self._refuse(request, store_unavailable(), sse, send, early)

    async def _refuse(self, request: ExecuteRequest, err: ErrorBody, sse: bool, send: Send,
                      early: relay.EarlyStream | None = None) -> Answer:
        """Answer a call refused before it reached a worker (nothing is recorded): with a fresh
        execution id, or the one its stream named already (``early``, begun)."""
        begun = early.stream if early is not None else None
        exec_id = early.execution_id if early is not None and begun is not None else keys.new_execution_id()
        record = records.refused(exec_id, request.tool, err)
        if begun is not None:
            await begun.finish(record, replayed=False)
        elif sse:  # execution.started names the tool: an unknown one is the caller's text, cut
            await relay.send_sse_record(send, exec_id, clip(request.tool), record, replayed=False)
        else:
            await relay.send_json(send, record)
        return Answer.of("refused", record, exec_id, request)

    async def _accepted(self, request: ExecuteRequest, started: Started, asgi: tuple[Scope, Receive, Send]) -> Answer:
        """``Prefer: respond-async``: 202 and a Location to poll; leaving does not cancel it.

        A retry of a finished execution was answered with its result at once (RFC 7240 lets a
        server answer synchronously when it can).
        """
        await accepted(started.execution_id, started.state, asgi[0])(*asgi)
        return Answer("accepted", 202, request.tool, started.execution_id, None, request.request_id)

    async def _replay(self, request: ExecuteRequest, exec_id: str, record: Record, sse: bool, send: Send) -> Answer:
        if sse:
            await relay.send_sse_record(send, exec_id, record.tool, record, replayed=True)
        else:
            await relay.send_json(send, record)
        return Answer.of("replayed", record, exec_id, request)

    async def _follow(self, request: ExecuteRequest, started: Started, tool: CatalogTool, sse: bool,
                      asgi: tuple[Scope, Receive, Send], begun: relay.SseStream | None = None) -> Answer:
        scope, receive, send = asgi
        name, exec_id, joined = tool.spec.name, started.execution_id, not started.owner
        messages = started.messages
        if messages is None:  # pragma: no cover - start(follow=True) always subscribes
            raise RuntimeError("a followed call without its subscription")
        # Only the request that started an execution cancels it by going away.
        on_disconnect = None if joined else functools.partial(self.executions.abandon, exec_id, name)
        gone = departure.of(scope)
        if not sse and gone is not None:  # served by api/serving/server.py: no task watches receive()
            record = await relay.answer_json_unless_gone(send, self.executions, exec_id, name, messages, gone,
                                                         on_disconnect)
        elif not sse:
            work = relay.answer_json(send, self.executions, exec_id, name, messages)
            record = await relay.race_disconnect(work, receive, on_disconnect)
        else:
            self.metrics.sse_streams.inc()
            keepalive = self.settings.sse_keepalive
            try:
                if gone is not None:
                    record = await relay.stream_sse_unless_gone(send, self.executions, exec_id, name, messages, gone,
                                                                on_disconnect, replayed=joined, keepalive=keepalive,
                                                                begun=begun)
                else:
                    work = relay.stream_sse(send, self.executions, exec_id, name, messages, replayed=joined,
                                            keepalive=keepalive, begun=begun)
                    record = await relay.race_disconnect(work, receive, on_disconnect)
            finally:
                self.metrics.sse_streams.dec()
        if record is None:
            return Answer.of("disconnected", None, exec_id, request)
        return Answer.of("joined" if joined else "answered", record, exec_id, request)


def _log_request(answer: Answer, duration_ms: float) -> None:
    info_line(log, "request", {
        # An unknown tool's name is the caller's text: keep the line short whatever they sent.
        "event": "request", "execution_id": answer.execution_id, "tool": clip(answer.tool) if answer.tool else None,
        "request_id_hash": request_id_hash(answer.request_id), "outcome": answer.outcome,
        "status_code": answer.status_code, "error_code": answer.error_code,
        "replayed": answer.outcome in ("replayed", "joined"), "duration_ms": duration_ms,
    })


def _with_traceparent(send: Send, traceparent: bytes) -> Send:
    """``send`` with a ``traceparent`` header on the answer: the request's span, whose trace the
    execution's spans join (docs/protocol.md, 11)."""

    async def traced(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), (b"traceparent", traceparent)]}
        await send(message)

    return traced


def _end(span: Span, answer: Answer | None) -> None:
    if answer is not None:
        span.set_attribute("http.response.status_code", answer.status_code)
        span.set_attribute("carmy.outcome", answer.outcome)
        if answer.execution_id is not None:
            span.set_attribute("carmy.execution_id", answer.execution_id)
        if answer.tool is not None:
            span.set_attribute("carmy.tool", clip(answer.tool))
    span.end()
