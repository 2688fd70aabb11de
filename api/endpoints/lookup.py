"""Asynchronous executions, once accepted with ``Prefer: respond-async``:

* ``GET /agent/executions/{id}``: 202 and the status while queued or running; once finished,
  exactly the status and body a synchronous call would have received.
* ``GET /agent/executions/{id}/events``: the live events from now on, always ending with
  ``execution.completed`` (read from the record if it had already finished).
* ``DELETE /agent/executions/{id}``: cancel it; answers with the cancelled result, or with the
  result if it had already finished.

An execution belongs to the principal that created it: anyone else gets the same 404 as for an
id that never existed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from api.calling.calls import Calls
from api.calling.executions import Executions
from api.endpoints import relay
from api.events.hub import HubUnavailable
from api.events.mailbox import Mailbox
from api.guards.auth import trusted_context
from api.http.paths import root
from api.http.responses import NO_STORE, envelope, envelope_error
from api.settings import ApiSettings
from carmy_worker.sdk.errors import store_unavailable
from carmy_worker.store import keys
from carmy_worker.store.reads import Found
from carmy_worker.wire import Record, json_encoder

log = logging.getLogger("carmy.api")

# How long DELETE waits for the worker running an execution to record its cancellation.
CANCEL_WAIT_S = 10.0


def accepted(exec_id: str, state: str, scope: Scope) -> Response:
    """202 for an execution still in progress, with where (under the app's ``root``) and when to
    look again."""
    body = json_encoder.encode({"execution_id": exec_id, "status": "running" if state == "running" else "queued"})
    return Response(body, 202, {**NO_STORE, "location": f"{root(scope)}/agent/executions/{exec_id}",
                                "retry-after": "1"}, media_type="application/json")


def not_found() -> Response:
    return envelope_error("EXECUTION_NOT_FOUND", "No such execution (or it expired).")


def unavailable() -> Response:
    return envelope(store_unavailable())


class ExecutionRoutes:
    def __init__(self, *, settings: ApiSettings, calls: Calls) -> None:
        self.settings = settings
        self.calls = calls
        self.executions: Executions = calls.executions
        self.hub = calls.hub

    async def _find(self, scope: Scope) -> Found | None:
        exec_id = scope["path_params"]["execution_id"]
        if not keys.is_execution_id(exec_id):
            return None
        return await self.executions.lookup(exec_id, trusted_context(scope).principal)

    async def get(self, request: Request) -> Response:
        try:
            found = await self._find(request.scope)
        except RedisError:
            return unavailable()
        if found is None:
            return not_found()
        if found.record is not None:
            return relay.RecordResponse(found.record)
        return accepted(found.execution_id, found.state, request.scope)

    async def delete(self, request: Request) -> Response:
        try:
            found = await self._find(request.scope)
            if found is None:
                return not_found()
            if found.record is not None:
                return relay.RecordResponse(found.record)
            with self.hub.expect(found.execution_id) as messages:
                _, record = await self.calls.follow(found.execution_id, found.tool, stream=False)
                if record is not None:  # it ended meanwhile
                    return relay.RecordResponse(record)
                await self.executions.cancel(found.execution_id, found.tool)
                record = await self._wait(found, messages)
        except (RedisError, HubUnavailable):
            return unavailable()
        if record is None:  # the worker did not answer in time; it will record the cancellation
            return accepted(found.execution_id, "running", request.scope)
        return relay.RecordResponse(record)

    async def _wait(self, found: Found, messages: Mailbox) -> Record | None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CANCEL_WAIT_S):
                return await self.executions.outcome(found.execution_id, found.tool, messages)
        return None

    async def events(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI: an SSE stream that keeps listening for the client's disconnect."""
        try:
            found = await self._find(scope)
            if found is None:
                return await not_found()(scope, receive, send)
            if scope["method"] == "HEAD":  # the stream's head alone: not held until the execution ends
                await send({"type": "http.response.start", "status": 200, "headers": relay.SSE_HEADERS})
                return await send({"type": "http.response.body", "body": b""})
            exec_id = found.execution_id
            with self.hub.expect(exec_id) as messages:
                _, record = (found.state, found.record) if found.record else await self.calls.follow(
                    exec_id, found.tool, stream=True)
                if record is not None:
                    return await relay.send_sse_record(send, exec_id, found.tool, record, replayed=True)
                stream = relay.stream_sse(send, self.executions, exec_id, found.tool, messages, replayed=False,
                                          keepalive=self.settings.sse_keepalive)
                # Watching is not owning: a watcher that leaves does not cancel the execution.
                await relay.race_disconnect(stream, receive, None)
        except (RedisError, HubUnavailable):
            await unavailable()(scope, receive, send)
