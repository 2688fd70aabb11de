"""MCP over Streamable HTTP at ``/mcp``: the same catalog and the same execution path as
``POST /agent/execute``, spoken through the official SDK's low-level server.

Stateless, so that any API replica can serve any request and replicas need no session
affinity: the 2026-07-28 protocol is stateless by design, and the handshake versions (up to
2025-11-25) are served by the SDK's stateless mode, one short-lived transport per POST.
Responses are SSE once a call streams progress, and the SDK cancels a call's handler when its
client goes away; the handler then cancels the execution. A ``notifications/cancelled`` of
the handshake versions comes in a POST of its own: ``api.mcp.cancel`` relates it to its call,
which then ends unanswered. On 2026-07-28 a call may become a task (``api.mcp.tasks``).
Tools named ``carmy_*`` are the API's own (``api.mcp.system``), answered without a worker.

Errors: an unknown tool is a protocol error (-32602), as MCP lists it; every other refusal or
failure is a tool result (``isError``) the model can read (``api.mcp.wire.call_result``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Any, cast

import anyio
import mcp_types as types
from mcp.server.caching import CacheHint
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from redis.exceptions import RedisError
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from api.calling.audit import Audit
from api.calling.calls import Calls, Started
from api.calling.catalog import CatalogTool
from api.calling.checks import Rejected
from api.calling.executions import ADMISSION_GRACE_S
from api.calling.jobs import Jobs
from api.endpoints.discovery import CATALOG_MAX_AGE_S
from api.events.hub import HubUnavailable
from api.guards.auth import trusted_context
from api.guards.body import BodyTooLarge, ClientGone, read_body
from api.http.fields import header
from api.mcp.cancel import (
    SESSION_HEADER,
    CallRegistry,
    Unanswered,
    abandon,
    assigning_session_id,
    cancelled_request,
    replaying,
    request_scope,
)
from api.mcp.envelope import envelope_error
from api.mcp.system import SystemTools, reserved
from api.mcp.tasks import McpTasks, TaskResult
from api.mcp.wire import (
    META_ERROR,
    META_EXECUTION_ID,
    META_REPLAYED,
    META_REQUEST_ID,
    META_TRACEPARENT,
    call_result,
    mcp_tool,
    progress_decoder,
)
from api.settings import ApiSettings
from carmy_worker.sdk.context import AgentContext
from carmy_worker.sdk.errors import ECHO_LIMIT, clip, store_unavailable
from carmy_worker.store import keys, records
from carmy_worker.wire import ErrorBody, Event, Record

if TYPE_CHECKING:
    from carmy_worker.tracing import Tracing

log = logging.getLogger("carmy.api")

MCP_PATH = "/mcp"
INSTRUCTIONS = (
    'Give a tools/call _meta {"carmy/request_id": "<unique id>"} to make retrying it safe: the same '
    "id with the same arguments returns the first call's result instead of running the tool again."
)

Ctx = ServerRequestContext[Any, Any]


class McpServer:
    """The MCP endpoint: ``asgi`` serves ``/mcp`` while ``lifespan()`` is entered (``create_app``
    mounts both)."""

    def __init__(self, *, settings: ApiSettings, calls: Calls, jobs: Jobs, audit: Audit,
                 tracing: Tracing | None = None) -> None:
        self.settings = settings
        self.tracing = tracing  # None: tracing is off, and no span is made
        self.calls = calls
        self.catalog = calls.catalog
        self.executions = calls.executions
        self.registry = CallRegistry(calls.executions.redis)
        self.system = SystemTools(settings=settings, jobs=jobs, audit=audit)
        self.server: Server[Any] = Server(
            settings.server_name, version=_version(), title=settings.server_title,
            description=settings.server_description, instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools, get_tool_input_schema=self._input_schema,
            # 2026-07-28's ttlMs/cacheScope: what GET /agent/tools says in Cache-Control.
            cache_hints={"tools/list": CacheHint(ttl_ms=CATALOG_MAX_AGE_S * 1000, scope="private")},
        )
        # Registered directly, not as on_call_tool: on 2026-07-28 it may answer with a task.
        self.server.add_request_handler("tools/call", types.CallToolRequestParams, self._call_tool)
        self.tasks = McpTasks(settings=settings, executions=calls.executions)
        self.tasks.install(self.server)
        self._listed: dict[tuple[bool, bool], tuple[str, types.ListToolsResult]] = {}
        self._manager: StreamableHTTPSessionManager | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        # A session manager runs once: a new one each time the app starts. It runs in a task of
        # its own because its anyio task group must be left by the task that entered it, and a
        # host (or a test harness) may end the lifespan from another task than it started in.
        manager = StreamableHTTPSessionManager(
            app=self.server, stateless=True, json_response=False, max_request_body_size=self.settings.max_body)
        running, stop = asyncio.Event(), asyncio.Event()

        async def serve() -> None:
            async with manager.run():
                self._manager = manager
                running.set()
                try:
                    await stop.wait()
                finally:
                    self._manager = None

        task = asyncio.create_task(serve())
        ready = asyncio.ensure_future(running.wait())
        await asyncio.wait((task, ready), return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if task.done():
            task.result()  # it failed to start: say why
        try:
            yield
        finally:
            stop.set()
            await task

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        manager = self._manager
        if manager is None:
            await Response("MCP is not running: the app's lifespan has not started.", 503)(scope, receive, send)
            return
        scope = _trimmed(scope)
        if scope["method"] != "POST":
            # Stateless: no stream of server-initiated messages (GET) and no session to end (DELETE).
            await Response(status_code=405, headers={"allow": "POST"})(scope, receive, send)
            return
        try:
            body = await read_body(scope, receive, self.settings.max_body)
        except BodyTooLarge:
            await Response("Request body too large", 413)(scope, receive, send)
            return
        except ClientGone:
            return
        # In every revision: 2026-07-28's transport parses with Python's json, which takes NaN,
        # Infinity and lone surrogates (a NaN argument would become null; a surrogate fails later).
        refusal = envelope_error(body)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        receive = replaying(body, receive)
        if _handshake_era(scope):
            # Handled here: the SDK would only see a request id it does not know.
            is_cancel, request_id = cancelled_request(body)
            if is_cancel:
                await self._cancel_call(scope, request_id)
                await Response(status_code=202)(scope, receive, send)
                return
            if header(scope, SESSION_HEADER.encode()) is None:
                send = assigning_session_id(send)
            send = scope[Unanswered.SCOPE_KEY] = Unanswered(send)
        await manager.handle_request(scope, receive, send)

    # --- tools/list ------------------------------------------------------------------------

    async def _list_tools(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        view = self.catalog.view
        shape = (_modern(ctx), self.system.operator_sees(trusted_context(request_scope(ctx))))
        listed = self._listed.get(shape)
        if listed is None or listed[0] != view.catalog.etag:  # built once per catalog version, era and role
            modern, operator = shape
            # A worker's tool of a reserved name is left out: the system tool of that name wins.
            tools = [mcp_tool(t.spec, title=t.title, any_output=modern) for t in view.tools.values()
                     if not reserved(t.spec.name)]
            tools = sorted([*tools, *self.system.listed(operator=operator)], key=lambda t: t.name)
            listed = self._listed[shape] = (view.catalog.etag, types.ListToolsResult(tools=tools))
        return listed[1]

    def _input_schema(self, name: str) -> Mapping[str, Any] | None:
        # For Mcp-Param-* headers; system tools declare none.
        tool = None if reserved(name) else self.catalog.view.get(name)
        return None if tool is None else tool.spec.input_schema

    # --- tools/call: the path of POST /agent/execute -----------------------------------------

    async def _call_tool(self, ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult | TaskResult:
        start = time.perf_counter()
        result: types.CallToolResult | TaskResult | None = None
        span, traceparent = None, None
        if self.tracing is not None:
            # The MCP SDK's own spans use the global tracer provider, which Carmy leaves unset.
            span = self.tracing.start(f"tools/call {clip(params.name)}", _traceparent(params.meta), {
                "mcp.method.name": "tools/call", "gen_ai.tool.name": clip(params.name)}, server=True)
            traceparent = self.tracing.traceparent(span)
        try:
            result = await self._answer(ctx, params, traceparent)
            return result
        finally:
            if span is not None:
                meta = (result.meta or {}) if isinstance(result, types.CallToolResult) else {}
                if meta.get(META_EXECUTION_ID):
                    span.set_attribute("carmy.execution_id", meta[META_EXECUTION_ID])
                span.end()
            if not isinstance(result, dict):  # a task is logged as one (api.mcp.tasks)
                meta = (result.meta or {}) if result is not None else {}
                err = meta.get(META_ERROR)
                log.info("mcp call", extra={"carmy": {
                    # An unknown tool's name is the caller's text: keep the line short whatever they sent.
                    "event": "mcp.call", "execution_id": meta.get(META_EXECUTION_ID), "tool": clip(params.name),
                    "outcome": "completed" if result is not None and not result.is_error else "failed",
                    "error_code": err.get("code") if err else None, "replayed": meta.get(META_REPLAYED),
                    "duration_ms": round((time.perf_counter() - start) * 1000, 1),
                }})

    async def _answer(self, ctx: Ctx, params: types.CallToolRequestParams,
                      traceparent: str | None = None) -> types.CallToolResult | TaskResult:
        agent = trusted_context(request_scope(ctx))
        name, modern = params.name, _modern(ctx)
        if reserved(name):  # the API's own tool, whatever a worker publishes: no execution, never a task
            return await self.system.call(name, params.arguments, agent)
        if self.catalog.view.get(name) is None and self.catalog.known:
            # A protocol error in MCP (the model cannot fix it by changing arguments), where
            # carmy/1 answers 404 TOOL_NOT_FOUND.
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {clip(name)}")
        try:
            call = self.calls.admit(name, {} if params.arguments is None else params.arguments,
                                    _request_id(params.meta), agent, id_field=f"_meta.{META_REQUEST_ID}")
            tool = call.tool
            patience = self.tasks.patience(ctx)  # None: this call cannot become a task
            report_progress = _may_report_progress(params.meta)
            # Only a caller that gave a progressToken hears the tool's progress: for the others,
            # the workers publish only the final event.
            streams = report_progress and _progress_token(params.meta) is not None
            async with self.calls.start(tool, call.arguments, call.request_id, agent, stream=streams,
                                        traceparent=traceparent, via="mcp") as started:
                record = started.record or await self._follow(ctx, started, tool, agent,
                                                              report_progress=report_progress,
                                                              patience=patience)
                if record is None:  # still going after `patience`: a task to poll
                    return await self.tasks.created(ctx, started.execution_id, name, agent, owner=started.owner)
                if await self._cancelled_by_client(ctx, agent):
                    # Whatever the record says: the request was cancelled, and gets no answer (the
                    # record may be the tool's own, a sync tool that never looked at
                    # ctx.cancelled, or an earlier call's, for a retry that joined or replayed it).
                    unanswered = request_scope(ctx).get(Unanswered.SCOPE_KEY)
                    if unanswered is not None:
                        unanswered.silence()
                return call_result(record, replayed=not started.owner, any_output=modern)
        except Rejected as rejected:
            return _refused(name, rejected.error)
        except (RedisError, HubUnavailable, OSError) as exc:
            log.warning("store unavailable: %s", exc)
            return _refused(name, store_unavailable())

    async def _follow(self, ctx: Ctx, started: Started, tool: CatalogTool, agent: AgentContext, *,
                      report_progress: bool, patience: float | None = None) -> Record | None:
        """Relay the execution's progress until its record; cancel it if this call is cancelled.
        None if it is still going after ``patience`` seconds (it goes on, uncancelled).

        A call its client cancelled with ``notifications/cancelled`` is left unanswered by
        ``_answer``: its stream just ends (the record says ``cancelled``, for a retry).
        """
        name, exec_id, messages, owner = tool.spec.name, started.execution_id, started.messages, started.owner
        if messages is None:  # pragma: no cover - start(follow=True) always subscribes
            raise RuntimeError("a followed call without its subscription")
        last: float | None = None

        async def report(event: Event) -> None:
            nonlocal last
            if not report_progress or event.name != "tool.progress":
                return
            progress = progress_decoder.decode(event.data)
            # MCP wants progress to increase: a partial result (same value again) is skipped.
            if last is None or progress.progress > last:
                last = progress.progress
                await ctx.session.report_progress(progress.progress, progress.total, progress.message)

        try:
            await self._remember(ctx, agent, exec_id, tool, owner=owner)
            record = None
            with anyio.move_on_after(patience):  # its own timeout is no cancellation of the call
                record = await self.executions.outcome(exec_id, name, messages, on_event=report)
            if record is None:
                return None
        except anyio.get_cancelled_exc_class():
            # The client went away, or cancelled. Only the call that started an execution
            # cancels it: a retry that joined it leaves it to its owner.
            if owner:
                await abandon(self.executions, exec_id, name)
            raise
        return record

    # --- notifications/cancelled in requests of their own (handshake versions) ---------------

    async def _remember(self, ctx: Ctx, agent: AgentContext, exec_id: str, tool: CatalogTool, *,
                        owner: bool) -> None:
        """Record the execution the call follows, for a cancellation to find; if one came first
        and this call started the execution, cancel it now."""
        session = _session(ctx)
        if session is None or ctx.request_id is None:
            return
        ttl = int(self.settings.queue_timeout + tool.timeout + ADMISSION_GRACE_S)
        try:
            overtaken = await self.registry.remember(agent, session, ctx.request_id, exec_id, tool.spec.name, ttl,
                                                     owner=owner)
        except RedisError as exc:  # the call goes on; only a cancellation could not find it
            log.warning("could not record MCP call %s: %s", exec_id, exc)
            return
        if overtaken and owner:
            await self.executions.abandon(exec_id, tool.spec.name)

    async def _cancelled_by_client(self, ctx: Ctx, agent: AgentContext) -> bool:
        """Whether a ``notifications/cancelled`` (at any replica) ended this call's execution."""
        session = _session(ctx)
        if session is None or ctx.request_id is None:
            return False
        try:
            return await self.registry.is_cancelled(agent, session, ctx.request_id)
        except RedisError:  # the record says cancelled either way: answering it is the safe side
            return False

    async def _cancel_call(self, scope: Scope, request_id: types.RequestId | None) -> None:
        session = header(scope, SESSION_HEADER.encode())
        if session is None or request_id is None:
            return
        try:
            started = await self.registry.cancelled(trusted_context(scope), session, request_id)
        except RedisError as exc:
            log.warning("could not cancel an MCP call: %s", exc)
            return
        if started is not None:
            await self.executions.abandon(*started)


def _refused(name: str, err: ErrorBody) -> types.CallToolResult:
    """A call refused before it reached a worker: a fresh execution id, nothing recorded."""
    return call_result(records.refused(keys.new_execution_id(), name, err), replayed=False)


def _request_id(meta: types.RequestParamsMeta | None) -> object:
    """``_meta["carmy/request_id"]`` as sent (any JSON value): ``Calls.admit`` checks it in turn."""
    return cast("Mapping[str, Any]", meta or {}).get(META_REQUEST_ID)


def _traceparent(meta: types.RequestParamsMeta | None) -> str | None:
    """``_meta.traceparent`` (W3C Trace Context in MCP's ``_meta``), if a string."""
    value = cast("Mapping[str, Any]", meta or {}).get(META_TRACEPARENT)
    return value if isinstance(value, str) else None


def _may_report_progress(meta: types.RequestParamsMeta | None) -> bool:
    """Each progress notification repeats the caller's ``progressToken``: an over-long one gets
    none (MCP lets a server send none), rather than having its size multiplied."""
    token = _progress_token(meta)
    return token is None or len(str(token)) <= ECHO_LIMIT


def _progress_token(meta: types.RequestParamsMeta | None) -> object:
    return meta.get("progress_token") if meta else None  # the SDK's name for progressToken


def _session(ctx: Ctx) -> str | None:
    headers = getattr(ctx.request, "headers", None)
    return headers.get(SESSION_HEADER) if headers is not None else None


def _modern(ctx: Ctx) -> bool:
    """Whether the request speaks a stateless revision (2026-07-28), with its wider shapes."""
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _trimmed(scope: Scope) -> Scope:
    """``scope`` with the whitespace around ``Mcp-*`` header values removed, as RFC 9110 says a
    field value is read (the SDK compares them with the body as they come; a value whose edges
    matter is sent base64-wrapped, so nothing is lost)."""
    headers = scope["headers"]
    if not any(k.startswith(b"mcp-") and v != v.strip(b" \t") for k, v in headers):
        return scope
    return {**scope, "headers": [(k, v.strip(b" \t") if k.startswith(b"mcp-") else v) for k, v in headers]}



def _handshake_era(scope: Scope) -> bool:
    """Whether the SDK serves this request by the handshake versions (as its manager decides)."""
    version = header(scope, b"mcp-protocol-version")
    return version is None or version in HANDSHAKE_PROTOCOL_VERSIONS


def _version() -> str:
    try:
        return metadata.version("carmy")
    except metadata.PackageNotFoundError:
        return ""
