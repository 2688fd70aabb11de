"""``notifications/cancelled`` across requests and replicas, for MCP's handshake versions.

There a client cancels a call by POSTing ``notifications/cancelled`` in a request of its own,
which a stateless server, or another replica, cannot relate to the call. So the answer to
``initialize`` assigns an ``Mcp-Session-Id`` that names no server state, only a namespace: each
``tools/call`` records in Redis, under (caller, that id, JSON-RPC id), the execution it
started, and the cancellation finds it there, wherever it lands. Either may come first: both
swap the same key atomically, so whichever comes second sees the other.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from mcp.shared.dispatcher import as_request_id, coerce_request_id
from mcp_types import RequestId
from redis.asyncio import Redis
from starlette.types import Message, Receive, Send

from carmy_worker.sdk.context import AgentContext
from carmy_worker.store import keys

SESSION_HEADER = "mcp-session-id"
CANCELLED_MARK = b"-"  # a call's entry once its cancellation arrived
CANCELLED_MARK_TTL_S = 60  # a cancellation that overtook its call waits this long for it


class CallRegistry:
    """Which execution each MCP call started, by (caller, MCP session, JSON-RPC id)."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def remember(self, agent: AgentContext, session: str, request_id: RequestId, exec_id: str, tool: str,
                       ttl: int) -> bool:
        """Record a call's execution; True if its cancellation already came (cancel it now)."""
        earlier = await self.redis.set(_key(agent, session, request_id), f"{exec_id} {tool}", ex=ttl, get=True)
        return bool(earlier == CANCELLED_MARK)

    async def cancelled(self, agent: AgentContext, session: str, request_id: RequestId) -> tuple[str, str] | None:
        """Mark a call cancelled; the (execution id, tool) to cancel if it was already recorded."""
        earlier = await self.redis.set(_key(agent, session, request_id), CANCELLED_MARK, ex=CANCELLED_MARK_TTL_S,
                                       get=True)
        if not earlier or earlier == CANCELLED_MARK:
            return None
        exec_id, _, tool = earlier.decode().partition(" ")
        return exec_id, tool


    async def is_cancelled(self, agent: AgentContext, session: str, request_id: RequestId) -> bool:
        """Whether a call's cancellation has come (its entry is the mark)."""
        return bool(await self.redis.get(_key(agent, session, request_id)) == CANCELLED_MARK)


def _key(agent: AgentContext, session: str, request_id: RequestId) -> str:
    # "7" and 7 name the same request, as in the SDK's own correlation.
    return keys.mcp_call(agent.principal, agent.session, session, str(coerce_request_id(request_id)))


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
        self._silenced = True

    async def __call__(self, message: Message) -> None:
        if self._ended:
            return
        if self._silenced and message["type"] == "http.response.body":
            self._ended = True
            message = {"type": "http.response.body", "body": b"", "more_body": False}
        await self._send(message)
