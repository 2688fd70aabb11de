"""One call of an operation: the request built from the tool's arguments, sent with the
process's pooled client, and the answer made the tool's result or a ``ToolError``.

The request goes to the configured base URL and the operation's path only (``params.url``).
It carries ``Idempotency-Key`` (``idempotency_key``), so an upstream that honours it acts once
however often the call is retried. Nothing here has a deadline of its own beyond connecting: the
tool's timeout and a cancellation cancel the call, which closes the connection, so the upstream
sees its request aborted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import msgspec

from carmy_worker.openapi import failures, params
from carmy_worker.openapi.auth import Auth
from carmy_worker.openapi.client import shared
from carmy_worker.openapi.operations import BODY, Operation
from carmy_worker.sdk.context import Context
from carmy_worker.sdk.errors import MAY_HAVE_COMMITTED, ToolError

MAX_ANSWER = 16 * 1024 * 1024  # bytes of an answer read; the result limit is smaller still
USER_AGENT = "carmy-openapi"
ACCEPT = "application/json, text/*;q=0.5, */*;q=0.1"  # JSON first; text is a result too
_PRINTABLE = frozenset(range(0x20, 0x7F))


def idempotency_key(ctx: Context) -> str:
    """The call's ``request_id`` as sent upstream; the execution id when it has none. A caller
    with a principal or session gets a digest of all three instead, so that two principals'
    equal request ids are not one request to the upstream (which sees one client, the worker);
    so does a request id that is not printable ASCII, which a header cannot carry."""
    rid = ctx.request_id
    if rid is None:
        return ctx.execution_id
    if ctx.principal is None and ctx.session is None and set(rid.encode()) <= _PRINTABLE:
        return rid
    identity = json.dumps([ctx.principal, ctx.session, rid]).encode()
    return "carmy-" + hashlib.sha256(identity).hexdigest()[:40]


class Upstream:
    """An HTTP API: where it is, its credentials, and how long a connection may take."""

    def __init__(self, base_url: httpx.URL, *, auth: Auth | None, connect_timeout: float) -> None:
        self.base_url = base_url
        self.auth = auth
        self._timeout = httpx.Timeout(None, connect=connect_timeout)

    def handler(self, operation: Operation) -> Callable[[Context, dict[str, Any]], Awaitable[Any]]:
        """The tool function of ``operation``."""

        async def call(ctx: Context, arguments: dict[str, Any]) -> Any:
            return await self.call(operation, ctx, arguments)

        call.__name__ = operation.name
        return call

    def request(self, operation: Operation, ctx: Context, arguments: dict[str, Any]) -> httpx.Request:
        """The request for one call (raises ``ToolError`` for a value no URL can carry)."""
        segments: dict[str, str] = {}
        query: list[tuple[str, str | int | float | bool | None]] = []
        headers = {"Accept": ACCEPT, "User-Agent": USER_AGENT, "Idempotency-Key": idempotency_key(ctx)}
        try:
            for param in operation.parameters:
                if param.name not in arguments:
                    continue
                value = arguments[param.name]
                if param.location == "path":
                    segments[param.name] = params.path_segment(param, value)
                elif param.location == "query":
                    query += params.query_pairs(param, value)
                else:
                    headers[param.name] = params.header_value(param, value)
            url = params.url(self.base_url, operation.path, segments)
        except params.ParameterError as exc:
            raise ToolError("INVALID_ARGUMENTS", f"The arguments cannot be sent: {exc}.", category="validation",
                            recoverable=True, details={"reason": str(exc)}) from None
        if self.auth is not None:
            headers.update(self.auth.headers())
            # The credential's own: a caller's object exploded into the query may name it too.
            query = [pair for pair in query if pair[0] not in self.auth.params()] + list(self.auth.params().items())
        content = None
        if operation.has_body and BODY in arguments:
            content = json.dumps(arguments[BODY], separators=(",", ":"), ensure_ascii=False).encode()
            headers["Content-Type"] = "application/json"
        try:
            return httpx.Request(operation.method, url, params=query, headers=headers, content=content,
                                 extensions={"timeout": self._timeout.as_dict()})
        except httpx.InvalidURL as exc:  # a part over httpx's 65,536 characters, say
            raise ToolError("INVALID_ARGUMENTS", f"The arguments cannot be sent: {exc}.", category="validation",
                            recoverable=True, details={"reason": str(exc)}) from None

    async def call(self, operation: Operation, ctx: Context, arguments: dict[str, Any]) -> Any:
        """Send the call's request; its 2xx answer as the result, anything else raised as a ``ToolError``."""
        request = self.request(operation, ctx, arguments)
        try:
            response = await shared().send(request, stream=True)
        except httpx.ConnectError as exc:
            raise failures.unavailable(f"The upstream API cannot be reached: {self._hide(exc)}.") from None
        except httpx.TimeoutException as exc:  # only connecting has a timeout of its own
            raise failures.unavailable(f"The upstream API did not accept a connection in time: {self._hide(exc)}.") \
                from None
        except httpx.TransportError as exc:
            raise failures.unavailable(
                f"The connection to the upstream API failed: {self._hide(exc)}. The request may have reached it."
            ) from None
        try:
            body = await _read(response)
        except httpx.DecodingError as exc:  # a Content-Encoding its body is not in
            raise failures.bad_answer(f"The upstream API's answer cannot be decoded: {self._hide(exc)}.") from None
        except httpx.TransportError as exc:  # cut short, or not HTTP's framing (a chunk header)
            said = f"The upstream API's answer broke off: {self._hide(exc)}. The request reached it."
            raise failures.unavailable(said if operation.method in failures.SAFE else f"{said} {MAY_HAVE_COMMITTED}") \
                from None
        finally:
            await response.aclose()
        if body is None:
            raise failures.bad_answer(f"The upstream API's answer is over {MAX_ANSWER:,} bytes.")
        text = self._hide_text(_text(response, body))
        if not 200 <= response.status_code < 300:
            raise failures.answered(response.status_code, response.reason_phrase, text,
                                    response.headers.get("retry-after"), method=operation.method)
        return _result(response, body, text, self.auth)

    def _hide(self, exc: Exception) -> str:
        return self._hide_text(str(exc) or type(exc).__name__)

    def _hide_text(self, text: str) -> str:
        return text if self.auth is None else self.auth.hide(text)


async def _read(response: httpx.Response) -> bytes | None:
    """The answer's body, or None past ``MAX_ANSWER`` bytes (the rest is not read)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_ANSWER:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _text(response: httpx.Response, body: bytes) -> str:
    """The answer's body as text, in its charset; as UTF-8 when that charset is one Python knows
    only as a codec of bytes to bytes or text to text (``base64``, ``rot13``), which httpx takes
    for an encoding (``codecs.lookup`` finds it) and ``bytes.decode`` refuses (``LookupError``)."""
    try:
        return body.decode(response.encoding or "utf-8", errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")


def _result(response: httpx.Response, body: bytes, text: str, auth: Auth | None) -> Any:
    """A 2xx answer as the tool's result: its JSON, its text, or None when it has no body. The
    credentials are blanked out of it (``text`` is already): an API may echo them (a ``next``
    link that repeats the request's URL, its API key included), and the result reaches every
    caller of the tool."""
    if not body.strip():
        return None
    kind = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind == "application/json" or kind.endswith("+json"):
        try:
            value = failures.strict_json(body)
            # Hidden in the JSON as msgspec writes it (escaping only quotes, backslashes and
            # control characters), then read again: every string, keys included, however deep.
            return value if auth is None else failures.strict_json(auth.hide(msgspec.json.encode(value).decode()))
        except ValueError as exc:
            raise failures.bad_answer(f"The upstream API's answer says it is JSON and is not ({exc}).") from None
    return text
