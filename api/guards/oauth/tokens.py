"""JWT access tokens to ``AgentContext``: signature, ``iss``, ``aud``, ``exp``/``nbf``, then the
principal and the permissions (the token's scopes)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Collection
from typing import Any, Literal, Protocol

import jwt
from msgspec import Struct

from api.guards.oauth.keys import Unavailable
from api.settings.oauth import OAuthSettings
from carmy_worker.sdk.context import AgentContext


class Keys(Protocol):
    async def key(self, kid: str | None, alg: str) -> jwt.PyJWK | Unavailable | None: ...


class Refusal(Struct, frozen=True):
    """Why a presented token does not stand for a caller: an RFC 6750 error code (or
    ``unavailable``: the issuer's keys cannot be had, which is not the caller's fault) and a
    description of our own wording, never text taken from the token."""

    error: Literal["invalid_token", "insufficient_scope", "unavailable"]
    description: str
    retry_after: int | None = None


# An agent sends the same token with every call: a token found valid is trusted again, without
# parsing or checking its signature, for this long at most (and never past its exp), so most
# calls cost a dict lookup instead of 0.1-0.5 ms of JOSE. The price: a key the issuer withdraws
# stops working up to this much later.
TRUSTED_FOR_S = 60.0
TRUSTED_TOKENS = 1024
# The cache is bounded in bytes too, since a token can be as large as the header limit (64 KiB):
# it is keyed by the token's SHA-256, not the token, and a caller whose name and scopes are larger
# than this is checked in full every time rather than kept. So it holds at most about
# TRUSTED_TOKENS * (TRUSTED_CONTEXT_BYTES + a few hundred bytes), 4.5 MiB, whatever callers send.
TRUSTED_CONTEXT_BYTES = 4096

# The library's findings, in the words the caller gets (error_description).
_REASONS: tuple[tuple[type[jwt.PyJWTError], str], ...] = (
    (jwt.ExpiredSignatureError, "The token has expired."),
    (jwt.ImmatureSignatureError, "The token is not valid yet."),
    (jwt.InvalidAudienceError, "The token is not meant for this server (aud)."),
    (jwt.InvalidIssuerError, "The token was not issued by the configured issuer (iss)."),
    (jwt.MissingRequiredClaimError, "The token lacks a required claim (exp, iss or aud)."),
    (jwt.InvalidSignatureError, "The token's signature does not verify."),
    (jwt.InvalidAlgorithmError, "The token's algorithm does not match its key."),
)


def looks_like_jwt(token: bytes) -> bool:
    """A JWS in compact form: three base64url parts (an API key never has dots in practice;
    one that does is still compared with the keys first)."""
    return token.count(b".") == 2


class TokenVerifier:
    """Checks access tokens from one issuer (``OAuthSettings``) against its keys."""

    def __init__(self, settings: OAuthSettings, keys: Keys, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.keys = keys
        self.algorithms = list(settings.algorithms)
        self.required = frozenset(settings.scopes)
        self.clock = clock
        self.checked = 0  # tokens checked in full, for tests
        # (SHA-256 of the token, audiences) -> (caller, until when it is trusted without a check),
        # oldest first.
        self._trusted: dict[tuple[bytes, tuple[str, ...]], tuple[AgentContext, float]] = {}

    async def verify(self, token: str, audiences: tuple[str, ...]) -> AgentContext | Refusal:
        """The caller ``token`` stands for, if it is valid here for one of ``audiences``."""
        now = self.clock()
        key = (hashlib.sha256(token.encode()).digest(), audiences)
        trusted = self._trusted.get(key)
        if trusted is not None:
            if now < trusted[1]:
                return trusted[0]
            del self._trusted[key]
        found, expires = await self._check(token, audiences)
        if isinstance(found, AgentContext) and _size(found) <= TRUSTED_CONTEXT_BYTES:
            if len(self._trusted) >= TRUSTED_TOKENS:
                del self._trusted[next(iter(self._trusted))]
            self._trusted[key] = (found, min(now + TRUSTED_FOR_S, expires))
        return found

    async def _check(self, token: str, audiences: Collection[str]) -> tuple[AgentContext | Refusal, float]:
        """The caller (and until when the token is valid), or why not."""
        self.checked += 1
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            return Refusal("invalid_token", "The token is not a well-formed JWT."), 0
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in self.algorithms:  # "none", HS256 and anything not configured
            return Refusal("invalid_token", "The token's algorithm is not accepted here."), 0
        if kid is not None and not isinstance(kid, str):
            return Refusal("invalid_token", "The token's kid is not a string."), 0
        key = await self.keys.key(kid, alg)
        if isinstance(key, Unavailable):
            return Refusal("unavailable", "The issuer's keys cannot be fetched now.", key.retry_after), 0
        if key is None:
            return Refusal("invalid_token", "The token names no key the issuer publishes for its algorithm."), 0
        try:
            claims = jwt.decode(token, key, algorithms=self.algorithms, audience=list(audiences),
                                issuer=self.settings.issuer, leeway=self.settings.leeway,
                                options={"require": ["exp", "iss", "aud"]})
        except jwt.PyJWTError as exc:
            return Refusal("invalid_token", next((text for kind, text in _REASONS if isinstance(exc, kind)),
                                                 "The token is not valid.")), 0
        return self._context(claims), float(claims["exp"]) + self.settings.leeway

    def _context(self, claims: dict[str, Any]) -> AgentContext | Refusal:
        principal = claims.get(self.settings.principal_claim)
        if not isinstance(principal, str) or not principal:
            return Refusal("invalid_token", f"The token has no {self.settings.principal_claim} to name its caller.")
        scopes = granted_scopes(claims)
        if not self.required <= scopes:
            return Refusal("insufficient_scope", "The token lacks a scope this server requires.")
        return AgentContext(principal=principal, permissions=scopes)


def _size(context: AgentContext) -> int:
    """About what a trusted caller costs to keep: its name and scopes, in characters."""
    return len(context.principal or "") + sum(len(scope) for scope in context.permissions)


def granted_scopes(claims: dict[str, Any]) -> frozenset[str]:
    """``scope`` (RFC 9068: space-separated), or ``scp`` (a list, as some issuers send it)."""
    scope = claims.get("scope", claims.get("scp"))
    if isinstance(scope, str):
        return frozenset(scope.split())
    if isinstance(scope, list):
        return frozenset(s for s in scope if isinstance(s, str) and s)
    return frozenset()
