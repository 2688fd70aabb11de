"""Who a request comes from: an API key, or an OAuth access token of the configured issuer.

Checked before the body is read. A presented token is first compared with every API key
through ``hmac.compare_digest`` on fixed-size digests, so the time taken does not depend on how
much of a key was right; a token that is no key and looks like a JWT is then verified
(``api.guards.oauth``). Refusals follow RFC 6750: ``401`` with a ``WWW-Authenticate: Bearer``
challenge, which names the protected resource metadata (RFC 9728) when OAuth is configured.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from api.guards.oauth.metadata import ProtectedResources
from api.guards.oauth.tokens import Refusal, TokenVerifier, looks_like_jwt
from api.http.fields import fields
from api.http.responses import envelope, envelope_error
from api.settings import ApiKey
from carmy_worker.sdk.context import AgentContext
from carmy_worker.sdk.errors import error

CONTEXT_SCOPE_KEY = "carmy.context"
_NO_CONTEXT = AgentContext()
_NOT_A_TOKEN = Refusal("invalid_token", "The token is neither an API key nor an access token of the issuer.")


def trusted_context(scope: Mapping[str, Any]) -> AgentContext:
    """The caller as API-key auth or the host's middleware established it; anonymous otherwise."""
    agent = scope.get(CONTEXT_SCOPE_KEY)
    return agent if isinstance(agent, AgentContext) else _NO_CONTEXT


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def bearer_token(authorization: bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive)."""
    if authorization is None or authorization[:7].lower() != b"bearer ":
        return None
    return authorization[7:].strip() or None


class ApiKeys:
    def __init__(self, keys: dict[str, ApiKey]) -> None:
        self._keys = [
            (_digest(token.encode()), AgentContext(principal=key.principal, permissions=key.permissions))
            for token, key in keys.items()
        ]

    def identify(self, token: bytes) -> AgentContext | None:
        """The context the token stands for, or None."""
        presented = _digest(token)
        found = None
        for digest, context in self._keys:  # no early exit: same work whichever key matches
            if hmac.compare_digest(presented, digest):
                found = context
        return found


def quotable(value: str) -> str:
    """``value`` without the characters RFC 6750 keeps out of its quoted strings."""
    return "".join(c if 0x20 <= ord(c) <= 0x7E and c not in '"\\' else "'" for c in value)


class Authenticator:
    """API keys (``CARMY_API_KEYS``), OAuth access tokens (``CARMY_OAUTH_*``), or both."""

    def __init__(self, keys: ApiKeys | None, tokens: TokenVerifier | None = None,
                 resources: ProtectedResources | None = None) -> None:
        self.keys = keys
        self.tokens = tokens
        self.resources = resources

    async def identify(self, authorization: bytes | None, *, mcp: bool) -> AgentContext | Refusal | None:
        """The caller, why its token is refused, or None when it presented none (or, with API
        keys only, an unknown one)."""
        token = bearer_token(authorization)
        if token is None:
            return None
        context = self.keys.identify(token) if self.keys is not None else None
        if context is not None:
            return context
        if self.tokens is None or self.resources is None:
            return None
        if not looks_like_jwt(token):
            return _NOT_A_TOKEN
        return await self.tokens.verify(token.decode("latin-1"), self.resources.audiences(mcp))

    def refuse(self, refusal: Refusal | None, *, mcp: bool) -> Response:
        """The answer to a request without a valid token (RFC 6750 section 3)."""
        if self.resources is None:
            return envelope_error("UNAUTHENTICATED", "A valid API key is required: Authorization: Bearer <key>.",
                                  headers={"www-authenticate": "Bearer"})
        if refusal is not None and refusal.error == "unavailable":
            return envelope(error("AUTH_UNAVAILABLE", "The access token cannot be checked now: the issuer's keys "
                                  "cannot be fetched. Try again later.", retry_after=refusal.retry_after))
        params = [("resource_metadata", self.resources.url(mcp))]
        if self.resources.scopes and (refusal is None or refusal.error == "insufficient_scope"):
            params.append(("scope", " ".join(self.resources.scopes)))
        if refusal is not None:
            params += [("error", refusal.error), ("error_description", refusal.description)]
        challenge = {"www-authenticate": "Bearer " + ", ".join(f'{k}="{quotable(v)}"' for k, v in params)}
        reason = refusal.description if refusal is not None else None
        if refusal is not None and refusal.error == "insufficient_scope":
            return envelope_error("INSUFFICIENT_SCOPE", "The access token lacks a scope this server requires: "
                                  f"{' '.join(self.resources.scopes)}.", reason=reason, headers=challenge)
        return envelope_error("UNAUTHENTICATED", "A valid access token or API key is required: "
                              "Authorization: Bearer <token>.", reason=reason, headers=challenge)


class RequireAuth:
    """Wraps an ASGI app: the request goes on with its caller in ``scope["carmy.context"]``, or
    is answered ``401 UNAUTHENTICATED`` (``403 INSUFFICIENT_SCOPE``, ``503 AUTH_UNAVAILABLE``).

    With ``auth=None`` (neither API keys nor OAuth configured) every request passes. ``mcp``:
    the route is the MCP endpoint, a resource of its own for OAuth (``ProtectedResources``).
    """

    def __init__(self, app: ASGIApp, auth: Authenticator | None, *, mcp: bool = False) -> None:
        self.app = app
        self.auth = auth
        self.mcp = mcp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.auth is None:
            return await self.app(scope, receive, send)
        authorization = fields(scope).get(b"authorization")
        found = await self.auth.identify(authorization, mcp=self.mcp)
        if not isinstance(found, AgentContext):
            return await self.auth.refuse(found, mcp=self.mcp)(scope, receive, send)
        scope[CONTEXT_SCOPE_KEY] = found
        await self.app(scope, receive, send)
