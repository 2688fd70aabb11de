"""``notifications/cancelled`` across requests and replicas, for MCP's handshake versions.

There a client cancels a call by POSTing ``notifications/cancelled`` in a request of its own,
which a stateless server, or another replica, cannot relate to the call. So the answer to
``initialize`` assigns an ``Mcp-Session-Id`` that names no server state, only a namespace: each
``tools/call`` records in Redis, under (caller, that id, JSON-RPC id), the execution it
started, and the cancellation finds it there, wherever it lands. Either may come first: both
swap the same key atomically, so whichever comes second sees the other (``store.mcpcalls``).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from mcp.server.context import ServerRequestContext
from mcp.shared.dispatcher import as_request_id, coerce_request_id
from mcp_types import RequestId
from redis.asyncio import Redis
from starlette.types import Message, Receive, Scope, Send

from carmy_worker.sdk.context import AgentContext

if TYPE_CHECKING:
    from api.calling.executions import Executions
from carmy_worker.store.mcpcalls import McpCall, McpCalls

SESSION_HEADER = "mcp-session-id"
CANCEL_TIMEOUT_S = 2.0  # how long a call whose client went away may spend cancelling its execution


class CallRegistry:
    """Which execution each MCP call follows, by (caller, MCP session, JSON-RPC id): the one it
    started, or the one it joined (a retry with the same ``carmy/request_id``). Kept in Redis by
    ``store.mcpcalls``."""

    def __init__(self, redis: Redis) -> None:
        self._calls = McpCalls(redis)

    async def remember(self, agent: AgentContext, session: str, request_id: RequestId, exec_id: str, tool: str,
                       ttl: int, *, owner: bool) -> bool:
        """Record the execution a call follows; True if its cancellation already came."""
        return await self._calls.remember(_call(agent, session, request_id), exec_id, tool, ttl, owner=owner)

    async def cancelled(self, agent: AgentContext, session: str, request_id: RequestId) -> tuple[str, str] | None:
        """Mark a call cancelled; the (execution id, tool) to cancel if the call started it (a
        call that joined another's execution leaves it to its owner, and only goes unanswered)."""
        followed = await self._calls.mark_cancelled(_call(agent, session, request_id))
        if followed is None:
            return None
        exec_id, tool, owner = followed
        return (exec_id, tool) if owner else None

    async def is_cancelled(self, agent: AgentContext, session: str, request_id: RequestId) -> bool:
        """Whether a call's cancellation has come."""
        return await self._calls.is_cancelled(_call(agent, session, request_id))


def _call(agent: AgentContext, session: str, request_id: RequestId) -> McpCall:
    # "7" and 7 name the same request, as in the SDK's own correlation.
    return McpCall(agent.principal, agent.session, session, str(coerce_request_id(request_id)))


class _Notification(msgspec.Struct):
    method: str
    params: dict[str, Any] = {}
    id: Any = msgspec.UNSET  # a notification has none


_notification_decoder = msgspec.json.Decoder(_Notification)


def cancelled_request(body: bytes) -> tuple[bool, RequestId | None]:
    """Whether a POST body is a ``notifications/cancelled``, and the request id it names."""
    if b"notifications/cancelled" not in body:  # most bodies are not: skip decoding them
        return False, None
    try:
        message = _notification_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return False, None  # not a well-formed one: left to the SDK to answer
    if message.method != "notifications/cancelled" or message.id is not msgspec.UNSET:
        return False, None
    return True, as_request_id(message.params.get("requestId"))


def replaying(body: bytes, receive: Receive) -> Receive:
    """``receive`` for an app that reads the body again; then the disconnect comes through."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


def assigning_session_id(send: Send) -> Send:
    """``send`` that gives a successful response a fresh ``Mcp-Session-Id`` (clients keep the one
    ``initialize`` got)."""
    session_id = uuid.uuid4().hex.encode()

    async def send_with_id(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] < 400:
            message = {**message, "headers": [*message.get("headers", []), (SESSION_HEADER.encode(), session_id)]}
        await send(message)

    return send_with_id


def request_scope(ctx: ServerRequestContext[Any, Any]) -> Scope:
    """The ASGI scope of the HTTP request that carried an MCP request (empty if none): its
    trusted context, and the ``Unanswered`` of a call that may be cancelled."""
    scope: Scope = getattr(ctx.request, "scope", {})
    return scope


async def abandon(executions: Executions, exec_id: str, tool: str) -> None:
    """Cancel the execution of a call whose client went away, from a task being cancelled itself:
    shielded, and bounded (the executions' own retries go on in the background)."""
    with anyio.move_on_after(CANCEL_TIMEOUT_S, shield=True):
        await executions.abandon(exec_id, tool)


class Unanswered:
    """``send`` for a call that its client may cancel: once ``silence()`` is called, the call's
    answer, whatever comes next in its stream, is replaced by the stream's end.

    MCP says a cancelled request gets no response. The SDK answers one it saw cancelled with
    ``-32800`` on the handshake versions' transport (so that its stream can end), and it never
    sees ours, which come in a POST of their own: clients then log a response for an unknown
    id. Ending the stream is all the client needs.
    """

    SCOPE_KEY = "carmy.mcp.unanswered"

    def __init__(self, send: Send) -> None:
        self._send = send
        self._silenced = False
        self._ended = False

    def silence(self) -> None:
        """The call's answer is not to be sent: end its stream instead."""
        self._silenced = True

    async def __call__(self, message: Message) -> None:
        if self._ended:
            return
        if self._silenced and message["type"] == "http.response.body":
            self._ended = True
            message = {"type": "http.response.body", "body": b"", "more_body": False}
        await self._send(message)
