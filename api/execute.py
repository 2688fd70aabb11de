"""``POST /agent/execute``: decode, resolve, check, submit, answer.

Written as a plain ASGI app rather than a Starlette endpoint so that it can read the body with
its own limit and keep listening for the client's disconnect while the tool runs.
"""

from __future__ import annotations

import logging
from typing import Any

import jsonschema
import msgspec
from redis.exceptions import RedisError
from starlette.types import Receive, Scope, Send

from api import relay
from api.auth import CONTEXT_SCOPE_KEY
from api.body import BodyTooLarge, ClientGone, read_body
from api.catalog import Catalog, CatalogTool
from api.executions import Executions, Submission
from api.hub import EventHub, HubUnavailable
from api.responses import envelope_error
from api.settings import ApiSettings
from carmy_worker import keys, records
from carmy_worker.context import AgentContext
from carmy_worker.errors import error
from carmy_worker.wire import ErrorBody, ExecuteRequest, Record, canonical_json_encoder, request_decoder

log = logging.getLogger("carmy.api")

MAX_ID_BYTES = 256
_NO_CONTEXT = AgentContext()


class Rejected(Exception):
    """A call refused after its envelope was decoded (answered with a full result body)."""

    def __init__(self, err: ErrorBody) -> None:
        self.error = err


def wants_sse(scope: Scope) -> bool:
    return any(name == b"accept" and b"text/event-stream" in value for name, value in scope["headers"])


def decode_envelope(body: bytes) -> ExecuteRequest | str:
    """The request, or the reason it is malformed."""
    try:
        return request_decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return str(exc)
    except RecursionError:
        return "JSON is nested too deeply"


def check_request_id(request_id: str | None) -> None:
    if request_id is None:
        return
    try:
        size = len(request_id.encode())
    except UnicodeEncodeError:
        size = 0
    if not 1 <= size <= MAX_ID_BYTES:
        raise Rejected(error("INVALID_ID", f"request_id must be 1 to {MAX_ID_BYTES} bytes of UTF-8."))


def check_policy(tool: CatalogTool, agent: AgentContext) -> None:
    spec = tool.spec
    if (spec.effect == "destructive" or spec.confirmation == "required") \
            and f"confirm:{spec.name}" not in agent.permissions:
        raise Rejected(error(
            "CONFIRMATION_REQUIRED",
            f"{spec.name} needs confirmation: the caller's context must grant confirm:{spec.name}.",
            suggested_action="ask the user to confirm, then call again with that permission",
        ))


def check_arguments(tool: CatalogTool, arguments: dict[str, Any]) -> None:
    try:
        problem = jsonschema.exceptions.best_match(tool.validator.iter_errors(arguments))
    except RecursionError:
        raise Rejected(error("INVALID_ARGUMENTS", "The arguments are nested too deeply.")) from None
    if problem is not None:
        path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in problem.absolute_path)
        raise Rejected(error(
            "INVALID_ARGUMENTS", f"The arguments do not match the input schema at {path}: {problem.message}",
            details={"path": path, "reason": problem.message},
        ))


class ExecuteEndpoint:
    def __init__(self, *, settings: ApiSettings, catalog: Catalog, executions: Executions, hub: EventHub) -> None:
        self.settings = settings
        self.catalog = catalog
        self.executions = executions
        self.hub = hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await read_body(scope, receive, self.settings.max_body)
        except BodyTooLarge:
            return await envelope_error("PAYLOAD_TOO_LARGE", f"The body exceeds {self.settings.max_body} bytes.")(
                scope, receive, send)
        except ClientGone:
            return
        request = decode_envelope(body)
        if isinstance(request, str):
            return await envelope_error("INVALID_REQUEST", "The request body is not a valid execute request.",
                                        reason=request)(scope, receive, send)
        agent = scope.get(CONTEXT_SCOPE_KEY) or _NO_CONTEXT
        sse = wants_sse(scope)
        try:
            check_request_id(request.request_id)
            tool = self.catalog.view.get(request.tool)
            if tool is None:
                raise Rejected(error("TOOL_NOT_FOUND", f"No tool named {request.tool[:128]!r}.",
                                     suggested_action="list the tools at /agent/tools"))
            check_policy(tool, agent)
            check_arguments(tool, request.arguments)
            await self._execute(request, tool, agent, sse, receive, send)
        except Rejected as rejected:
            await self._answer_rejection(request.tool, rejected.error, sse, send)
        except (RedisError, HubUnavailable, OSError) as exc:
            log.warning("store unavailable: %s", exc)
            await self._answer_rejection(request.tool, error(
                "STORE_UNAVAILABLE", "The execution store cannot be reached.", retry_after=1), sse, send)

    async def _answer_rejection(self, tool: str, err: ErrorBody, sse: bool, send: Send) -> None:
        exec_id = keys.new_execution_id()
        record = records.failed(exec_id, tool, err)
        if sse:
            await relay.send_sse_record(send, exec_id, tool, record, replayed=False)
        else:
            await relay.send_json(send, record)

    async def _execute(self, request: ExecuteRequest, tool: CatalogTool, agent: AgentContext, sse: bool,
                       receive: Receive, send: Send) -> None:
        arguments = canonical_json_encoder.encode(request.arguments)
        exec_id = keys.new_execution_id()
        async with self.hub.subscribe(keys.events(exec_id)) as messages:
            sub = await self.executions.submit(
                exec_id=exec_id, tool=tool, arguments=arguments, request_id=request.request_id, agent=agent)
            if sub.kind == "join":  # someone else's execution of the same request: follow that one
                async with self.hub.subscribe(keys.events(sub.execution_id)) as joined:
                    record = await self.executions.settled(sub.execution_id, tool.spec.name)
                    await self._answer(sub, tool, record, joined, sse, receive, send)
                return
            await self._answer(sub, tool, sub.record, messages, sse, receive, send)

    async def _answer(self, sub: Submission, tool: CatalogTool, record: Record | None, messages: Any,
                      sse: bool, receive: Receive, send: Send) -> None:
        name = tool.spec.name
        if sub.kind in ("conflict", "full", "no_workers"):
            raise Rejected(self._refusal(sub, name))
        replayed = sub.kind != "new"
        if record is not None:  # a finished execution of the same request
            if sse:
                await relay.send_sse_record(send, sub.execution_id, name, record, replayed=True)
            else:
                await relay.send_json(send, record)
            return
        exec_id = sub.execution_id
        events = self.executions.follow(exec_id, name, messages, tick=min(self.settings.sse_keepalive, 5.0))

        async def cancel() -> None:
            try:
                await self.executions.cancel(exec_id, name)
            except RedisError as exc:
                log.warning("could not cancel %s: %s", exec_id, exc)

        # Only the request that started an execution cancels it by going away.
        on_disconnect = None if replayed else cancel
        if sse:
            work = relay.stream_sse(send, relay.started_frame(exec_id, name), events, replayed=replayed,
                                    keepalive=self.settings.sse_keepalive)
        else:
            work = relay.answer_json(send, events)
        await relay.race_disconnect(work, receive, on_disconnect)

    def _refusal(self, sub: Submission, name: str) -> ErrorBody:
        if sub.kind == "conflict":
            return error(
                "IDEMPOTENCY_CONFLICT",
                "This request_id was already used with another tool or other arguments.",
                suggested_action="use a new request_id for a different call",
                details={"execution_id": sub.execution_id},
            )
        if sub.kind == "full":
            return error("QUEUE_FULL", f"Too many executions in progress ({sub.pending}); try again shortly.",
                         retry_after=1)
        return error("NO_WORKERS", f"No live worker serves {name} right now.", retry_after=2)
