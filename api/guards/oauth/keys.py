"""The issuer's public keys: a JWK Set fetched over HTTP and cached (``RemoteKeys``), or read
once from a file (``StaticKeys``). Both answer ``key(kid, alg)`` with a key, ``None`` (no such
key: the token is refused) or ``Unavailable`` (the keys cannot be had now: not the caller's fault).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jwt
import msgspec
from msgspec import Struct

from carmy_worker.settings import SettingsError

log = logging.getLogger("carmy.api.oauth")

FETCH_TIMEOUT_S = 3.0  # a request waits at most this for the issuer, then is answered 503
MAX_JWKS_BYTES = 1_048_576


class Unavailable(Struct, frozen=True):
    """No key set could be fetched, and none is cached: ask again after ``retry_after`` seconds."""

    retry_after: int


class KeySet:
    """The signing keys of one JWK Set document, by ``kid``.

    Keys that cannot verify signatures are left out: symmetric ones (``oct``), keys for
    encryption (``use: enc``), types or curves the JOSE library does not know, and keys it cannot
    read at all, however it fails on them (``"alg": [1]`` is a ``TypeError``, not a ``PyJWTError``):
    one malformed key in an issuer's set must not make every token's check fail.
    """

    def __init__(self, jwks: Any) -> None:
        if not isinstance(jwks, dict) or not isinstance(jwks.get("keys"), list):
            raise ValueError('a JWK Set is a JSON object with a "keys" array')
        self._jwks: dict[str | None, dict[str, Any]] = {}
        for jwk in jwks["keys"]:
            if not isinstance(jwk, dict) or jwk.get("kty") == "oct" or jwk.get("use", "sig") != "sig":
                continue
            kid = jwk.get("kid")
            try:
                jwt.PyJWK(jwk)
            except Exception:  # PyJWTError, or whatever else a malformed field makes it raise
                continue
            self._jwks[kid if isinstance(kid, str) else None] = jwk
        self._prepared: dict[tuple[str | None, str], jwt.PyJWK | None] = {}

    def __len__(self) -> int:
        return len(self._jwks)

    def __contains__(self, kid: str | None) -> bool:
        return kid in self._jwks

    def key(self, kid: str | None, alg: str) -> jwt.PyJWK | None:
        """The key named ``kid``, bound to ``alg``; None if there is none, or it is not for ``alg``.

        A token without ``kid`` may use the set's only key.
        """
        if kid not in self._jwks and not (kid is None and len(self._jwks) == 1):
            return None  # not remembered: a made-up kid comes from an unverified header
        if (kid, alg) not in self._prepared:
            self._prepared[(kid, alg)] = self._prepare(kid, alg)
        return self._prepared[(kid, alg)]

    def _prepare(self, kid: str | None, alg: str) -> jwt.PyJWK | None:
        jwk = self._jwks.get(kid)
        if jwk is None and kid is None and len(self._jwks) == 1:
            jwk = next(iter(self._jwks.values()))
        if jwk is None or jwk.get("alg", alg) != alg:
            return None
        try:  # the key is bound to alg: an RSA key cannot be used as an EC or HMAC one
            return jwt.PyJWK(jwk, algorithm=alg)
        except Exception:  # as in __init__
            return None


class StaticKeys:
    """A key set read once from a file (``CARMY_OAUTH_JWKS_FILE``): tests, air-gapped setups."""

    def __init__(self, path: str) -> None:
        try:
            self.keys = KeySet(msgspec.json.decode(Path(path).read_bytes()))
        except (OSError, ValueError) as exc:
            raise SettingsError(f"CARMY_OAUTH_JWKS_FILE {path!r} cannot be used: {exc}") from None
        if not self.keys:
            raise SettingsError(f"CARMY_OAUTH_JWKS_FILE {path!r} has no signing key")

    async def key(self, kid: str | None, alg: str) -> jwt.PyJWK | Unavailable | None:
        return self.keys.key(kid, alg)


class RemoteKeys:
    """The issuer's key set at ``url``, fetched when first needed and cached.

    It is fetched again once it is ``max_age`` old, and sooner when a token names a ``kid`` it
    does not have (the issuer rotated its keys); but never twice within ``min_refresh``
    seconds, so tokens with made-up ``kid`` values cost the issuer one request per interval at
    most. Concurrent requests share one fetch. When a fetch fails, the cached set stays in use;
    with none cached, verification answers ``Unavailable``.
    """

    def __init__(self, url: str, *, max_age: float, min_refresh: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.max_age = max_age
        self.min_refresh = min_refresh
        self.clock = clock
        self._keys: KeySet | None = None
        self._fetched_at = -math.inf  # when the cached set was fetched
        self._attempted_at = -math.inf  # when the last fetch ended, successful or not
        self._lock = asyncio.Lock()

    async def key(self, kid: str | None, alg: str) -> jwt.PyJWK | Unavailable | None:
        now = self.clock()
        known = self._keys is not None and self._keys.key(kid, alg) is not None
        # Stale, or a kid not in it (rotated, or made up: _refresh limits the rate). A request
        # whose key is cached does not wait for a fetch already under way.
        if (not known or now - self._fetched_at >= self.max_age) and not (known and self._lock.locked()):
            await self._refresh(now)
        if self._keys is None:
            wait = self._attempted_at + self.min_refresh - self.clock()
            return Unavailable(retry_after=max(1, math.ceil(wait)))
        return self._keys.key(kid, alg)

    async def _refresh(self, asked_at: float) -> None:
        async with self._lock:
            # Someone else fetched while this request waited, or fetched too recently.
            if self._attempted_at >= asked_at or self.clock() - self._attempted_at < self.min_refresh:
                return
            try:
                keys = await self._fetch()
            except (httpx.HTTPError, ValueError) as exc:
                log.warning("the issuer's key set could not be fetched from %s: %s%s", self.url, exc,
                            "; the cached one stays in use" if self._keys is not None else "")
            else:
                self._keys, self._fetched_at = keys, self.clock()
            finally:
                self._attempted_at = self.clock()

    async def _fetch(self) -> KeySet:
        async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_S) as client, \
                client.stream("GET", self.url, headers={"accept": "application/json"}) as response:
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            body = b""
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise ValueError(f"larger than {MAX_JWKS_BYTES} bytes")
        try:
            document = msgspec.json.decode(body)
        except RecursionError:
            raise ValueError("nested too deeply") from None
        keys = KeySet(document)
        if not keys:
            raise ValueError("no signing key in it")
        return keys
