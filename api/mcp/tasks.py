"""MCP Tasks (SEP-2663, the extension ``io.modelcontextprotocol/tasks``) on Carmy's
asynchronous executions.

A 2026-07-28 ``tools/call`` whose own ``_meta`` declares the extension is followed inline for
up to ``CARMY_MCP_TASK_AFTER`` seconds; if its execution is still going then, it is answered
with a task (``resultType: "task"``) whose id is the execution id, and the execution goes on
as one accepted with ``Prefer: respond-async`` would (``GET /agent/executions/{id}`` sees it).
``tasks/get`` reads it back, ``tasks/update`` acknowledges (tools never ask for input) and
``tasks/cancel`` cancels it as ``DELETE /agent/executions/{id}`` does; all three are scoped to
the principal that started it, like those routes.

How it is hooked into the SDK (mcp 2.3, low-level ``Server``), without touching the ASGI layer:

* advertised by ``Server.extensions``, which the low-level server reports in ``server/discover``
  (and ``initialize``, whose per-version sieve drops ``extensions`` on the handshake versions:
  those keep today's capabilities);
* the three methods are an ``mcp.server.extension.Extension``'s ``MethodBinding``s restricted to
  2026-07-28; the low-level server has no extension list, so ``install`` registers them with
  ``Server.add_request_handler`` behind the same version gate ``MCPServer`` puts on extension
  methods (other versions: Method not found, as before);
* the client's capabilities are ``ctx.session.client_capabilities``, which on 2026-07-28 is the
  request's own ``_meta["io.modelcontextprotocol/clientCapabilities"]``; the SDK's
  ``require_client_extension`` answers -32021 to a ``tasks/*`` request that lacks it;
* a task is returned from the ``tools/call`` handler as a plain dict: the runner leaves a result
  whose ``resultType`` is outside the core vocabulary to the extension that claims it (no
  per-version sieve) and still stamps ``serverInfo``.

An ``Extension.intercept_tool_call`` was not used for the choice between result and task: that
choice is made halfway through following an execution (``McpServer._follow``), which an
interceptor around the whole handler cannot reach.

Status: ``working`` while queued or running (``statusMessage``: the newest progress message);
``cancelled`` for a cancelled execution; ``completed`` for any other final record, with the
``CallToolResult`` the call would have answered inline (tool errors included: ``isError``).
``failed`` is never used: it is for JSON-RPC errors, and once an execution exists every
outcome, even ``EXECUTION_UNCERTAIN`` or ``TIMEOUT``, is a tool result.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any, Literal

import anyio
import mcp_types as types
import msgspec
from mcp.server.context import ServerRequestContext
from mcp.server.extension import Extension, MethodBinding, RequestHandler
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import require_client_extension
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp_types import methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from redis.exceptions import RedisError

from api.calling.executions import Executions
from api.guards.auth import trusted_context
from api.mcp.cancel import abandon, request_scope
from api.mcp.wire import call_result
from api.settings import ApiSettings
from carmy_worker.sdk.context import AgentContext
from carmy_worker.sdk.errors import store_unavailable
from carmy_worker.store import keys, records
from carmy_worker.store.reads import Found

log = logging.getLogger("carmy.api")

TASKS = "io.modelcontextprotocol/tasks"
POLL_INTERVAL_MS = 1000  # what a client is asked to wait between two tasks/get
UNKNOWN_TASK = "Unknown task: no such task, or it expired."

Ctx = ServerRequestContext[Any, Any]
TaskResult = dict[str, Any]  # a CreateTaskResult, as the SDK's runner takes it (see above)
TaskStatus = Literal["working", "completed", "cancelled"]


class Task(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """A ``CreateTaskResult`` (``resultType`` "task") or a ``tasks/get`` result ("complete")."""

    result_type: Literal["task", "complete"]
    task_id: str
    status: TaskStatus
    created_at: str
    last_updated_at: str
    ttl_ms: int | None  # always sent: null would mean "kept for ever"
    poll_interval_ms: int
    status_message: str | None = None
    result: dict[str, Any] | None = None  # a completed task's CallToolResult


class TaskParams(types.RequestParams):
    """``tasks/get`` and ``tasks/cancel``."""

    task_id: str


class UpdateTaskParams(TaskParams):
    """``tasks/update``; Carmy's tools never ask for input, so the responses are ignored."""

    input_responses: dict[str, Any] | None = None


class McpTasks(Extension):
    """The tasks extension of one ``McpServer``."""

    identifier = TASKS

    def __init__(self, *, settings: ApiSettings, executions: Executions) -> None:
        self.task_after = settings.mcp_task_after
        self.executions = executions
        self.ttl_ms = settings.retention * 1000  # the execution (and so the task) is kept that long

    def methods(self) -> list[MethodBinding]:
        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [MethodBinding("tasks/get", TaskParams, self._get, modern),
                MethodBinding("tasks/update", UpdateTaskParams, self._update, modern),
                MethodBinding("tasks/cancel", TaskParams, self._cancel, modern)]

    def install(self, server: Server[Any]) -> None:
        """Advertise the extension and serve its methods on ``server``."""
        server.extensions[self.identifier] = self.settings()
        for method in self.methods():
            server.add_request_handler(method.method, method.params_type, _version_gated(method))

    def patience(self, ctx: Ctx) -> float | None:
        """How long to follow this ``tools/call`` before answering with a task; None: no task
        (the request is not 2026-07-28, or its own ``_meta`` does not declare the extension)."""
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return None
        capabilities = ctx.session.client_capabilities
        declared = capabilities.extensions if capabilities is not None else None
        return self.task_after if declared and TASKS in declared else None

    async def created(self, ctx: Ctx, exec_id: str, tool: str, agent: AgentContext, *, owner: bool,
                      ) -> TaskResult | types.CallToolResult:
        """The ``CreateTaskResult`` of an execution still going after ``patience``.

        Its state is read back from the store, so a ``tasks/get`` of it is known to resolve. A
        client that leaves before it has this answer never learns the handle: the execution is
        cancelled, as any MCP call's would be (by the call that started it, not a retry).
        """
        try:
            found = await self.executions.lookup(exec_id, agent.principal)
        except (anyio.get_cancelled_exc_class(), RedisError) as exc:
            # The client cannot follow a task it will not hear of: cancel the execution, and say
            # which one it was (a retry with its request_id finds it).
            if owner:
                await abandon(self.executions, exec_id, tool)
            if not isinstance(exc, RedisError):
                raise
            log.warning("store unavailable: %s", exc)
            return call_result(records.refused(exec_id, tool, store_unavailable()), replayed=False)
        if found is None:  # the store lost it between the submit and now
            return call_result(records.uncertain(exec_id, tool, "the store lost track of it"), replayed=False)
        if found.record is not None:  # it ended as the wait did: its result, not a task to poll
            return call_result(found.record, replayed=not owner, any_output=True)
        log.info("mcp task", extra={"carmy": {"event": "mcp.task", "execution_id": exec_id, "tool": tool}})
        return self._task(found, "task", ctx.protocol_version)

    # --- tasks/get, tasks/update, tasks/cancel -------------------------------------------------

    async def _get(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        return self._task(await self._find(ctx, params), "complete", ctx.protocol_version)

    async def _update(self, ctx: Ctx, params: UpdateTaskParams) -> dict[str, Any]:
        await self._find(ctx, params)  # an unknown task is an error, even for an ack
        return {}

    async def _cancel(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        found = await self._find(ctx, params)
        if found.record is None:  # a finished task's cancellation changes nothing: an ack too
            try:
                await self.executions.cancel(found.execution_id, found.tool)
            except RedisError as exc:
                raise _store_unavailable(exc) from exc
        return {}

    async def _find(self, ctx: Ctx, params: TaskParams) -> Found:
        """The caller's task, or -32602; -32021 for a request that does not declare the extension,
        -32020 for one whose ``Mcp-Name`` header names another task (SEP-2663 has clients send
        the task id there, for routing: a proxy may have routed it by a name the body denies)."""
        require_client_extension(ctx, TASKS)
        headers = getattr(ctx.request, "headers", None)
        routed = headers.get(MCP_NAME_HEADER) if headers is not None else None
        if routed is not None and decode_header_value(routed) != params.task_id:
            raise MCPError(code=types.HEADER_MISMATCH, message=f"{MCP_NAME_HEADER} header does not match the taskId")
        found = None
        if keys.is_execution_id(params.task_id):
            try:
                found = await self.executions.lookup(params.task_id, trusted_context(request_scope(ctx)).principal)
            except RedisError as exc:
                raise _store_unavailable(exc) from exc
        if found is None:  # unknown, expired, or someone else's: indistinguishable on purpose
            raise MCPError(code=types.INVALID_PARAMS, message=UNKNOWN_TASK)
        return found

    def _task(self, found: Found, result_type: Literal["task", "complete"], version: str) -> dict[str, Any]:
        record = found.record
        status: TaskStatus = "working"
        # A message is the running attempt's (one put back in the queue keeps its last, stale).
        running = found.state == "running"
        message: str | None = found.message if running and found.message else (
            "Running." if running else "Waiting for a worker.")
        result = None
        if record is not None and record.error_code == "CANCELLED":
            status, message = "cancelled", "Cancelled."
        elif record is not None:
            status, message = "completed", None
            # What the call would have answered inline, through the same per-version shaping.
            shaped = call_result(record, replayed=False, any_output=version in MODERN_PROTOCOL_VERSIONS)
            dumped = shaped.model_dump(by_alias=True, mode="json", exclude_none=True)
            result = methods.serialize_server_result("tools/call", version, dumped)
        task = Task(result_type=result_type, task_id=found.execution_id, status=status,
                    created_at=_iso(found.created_ms), last_updated_at=_iso(found.updated_ms or found.created_ms),
                    ttl_ms=self.ttl_ms, poll_interval_ms=POLL_INTERVAL_MS, status_message=message, result=result)
        built: dict[str, Any] = msgspec.to_builtins(task)
        return built


def _version_gated(method: MethodBinding) -> RequestHandler:
    """``method``'s handler, answering Method not found on other protocol versions."""
    versions = method.protocol_versions

    async def gated(ctx: Ctx, params: Any) -> Any:
        if versions is not None and ctx.protocol_version not in versions:
            raise MCPError(code=types.METHOD_NOT_FOUND, message="Method not found", data=method.method)
        return await method.handler(ctx, params)

    return gated


def _store_unavailable(exc: Exception) -> MCPError:
    log.warning("store unavailable: %s", exc)
    return MCPError(code=types.INTERNAL_ERROR, message="The execution store cannot be reached; try again.")


def _iso(unix_ms: int | None) -> str:
    """ISO 8601, UTC, to the millisecond (Redis's clock, as the store keeps it)."""
    moment = datetime.datetime.fromtimestamp((unix_ms or 0) / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
