"""API keys: a bearer token stands for a principal and its permissions.

Checked before the body is read. The presented token is compared with every configured one
through ``hmac.compare_digest`` on fixed-size digests, so the time taken does not depend on how
much of a token was right.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from api.responses import envelope_error
from api.settings import ApiKey
from carmy_worker.sdk.context import AgentContext

CONTEXT_SCOPE_KEY = "carmy.context"
_NO_CONTEXT = AgentContext()


def trusted_context(scope: Mapping[str, Any]) -> AgentContext:
    """The caller as API-key auth or the host's middleware established it; anonymous otherwise."""
    agent = scope.get(CONTEXT_SCOPE_KEY)
    return agent if isinstance(agent, AgentContext) else _NO_CONTEXT


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class ApiKeys:
    def __init__(self, keys: dict[str, ApiKey]) -> None:
        self._keys = [
            (_digest(token.encode()), AgentContext(principal=key.principal, permissions=key.permissions))
            for token, key in keys.items()
        ]

    def identify(self, authorization: bytes | None) -> AgentContext | None:
        """The context a ``Bearer`` header stands for, or None."""
        if authorization is None or authorization[:7].lower() != b"bearer ":
            return None
        presented = _digest(authorization[7:].strip())
        found = None
        for digest, context in self._keys:  # no early exit: same work whichever key matches
            if hmac.compare_digest(presented, digest):
                found = context
        return found


class RequireApiKey:
    """Wraps an ASGI app: 401 ``UNAUTHENTICATED`` unless the request carries a known token.

    With ``keys=None`` (no API keys configured) every request passes.
    """

    def __init__(self, app: ASGIApp, keys: ApiKeys | None) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.keys is None:
            return await self.app(scope, receive, send)
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        context = self.keys.identify(authorization)
        if context is None:
            response = envelope_error("UNAUTHENTICATED", "A valid API key is required: Authorization: Bearer <key>.",
                                      headers={"www-authenticate": "Bearer"})
            return await response(scope, receive, send)
        scope[CONTEXT_SCOPE_KEY] = context
        await self.app(scope, receive, send)
