"""The console's session: a signed cookie, and the CSRF token bound to it.

A browser cannot send the API's bearer header by itself, so a person pastes a key once
(``signin``) and gets this cookie. It holds no secret: who signed in, whether they did (an
anonymous session only carries the CSRF token of the sign-in form, or of an open console), when
it ends and a random id, all under an HMAC-SHA256 of a secret every replica shares
(``CARMY_CONSOLE_SECRET``, or one written once in Redis). Nothing is stored per session: it ends
when it expires, and signing out forgets it in that browser.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

import msgspec
from msgspec import Struct
from redis.asyncio import Redis

from api.settings import ApiSettings
from carmy_worker.store.consolesecret import shared_secret

COOKIE = "carmy_console"  # over plain HTTP: a console on loopback
# Whenever the cookie is Secure. A browser takes a cookie of this name only with Secure, Path=/
# and no Domain, from an https page: a sibling subdomain's page or a plain-HTTP one (another port
# of this host, say) cannot set one that shadows it. Path=/ is the price: /agent/* gets it too,
# and never reads it (a cookie authenticates nothing there).
SECURE_COOKIE = "__Host-carmy_console"
MAX_COOKIE = 4096  # a browser keeps no more; anything longer is not ours
SECRET_RECHECK_S = 60.0
# How much later than the lifetime allows a session may end: the replicas' clocks may differ a little.
CLOCK_SLACK_S = 60


class Session(Struct, frozen=True, forbid_unknown_fields=True):
    """What the cookie says, once its signature is checked."""

    sid: str  # random: what the CSRF token is bound to
    principal: str | None
    signed_in: bool  # False: anonymous (the sign-in form's, or an open console's)
    expires: int  # Unix time, s


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Session).decode


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    """Seals sessions into cookie values and opens them again, and derives their CSRF tokens."""

    def __init__(self, secret: bytes, clock: Callable[[], float] = time.time, longest: int | None = None) -> None:
        self._secret = secret
        self._clock = clock
        self._longest = longest  # the lifetime sessions are issued with now (None: any)

    def _mac(self, purpose: bytes, message: bytes) -> bytes:
        # A purpose in every MAC: a CSRF token can never pass for a cookie's signature, or back.
        return hmac.new(self._secret, purpose + b":" + message, hashlib.sha256).digest()

    def seal(self, session: Session) -> str:
        payload = _encode(session)
        return f"{_b64(payload)}.{_b64(self._mac(b'session', payload))}"

    def open(self, value: str | None) -> Session | None:
        """The session ``value`` seals, or None if it is missing, forged, tampered with, expired, or
        ends later than the lifetime allows."""
        if not value or len(value) > MAX_COOKIE or value.count(".") != 1:
            return None
        payload_text, mac_text = value.split(".")
        try:
            payload, mac = _unb64(payload_text), _unb64(mac_text)
        except (binascii.Error, ValueError):
            return None
        if not hmac.compare_digest(mac, self._mac(b"session", payload)):
            return None
        try:
            session = _decode(payload)
        except msgspec.DecodeError:
            return None
        now = self._clock()
        if self._longest is not None and session.expires > now + self._longest + CLOCK_SLACK_S:
            # Issued under a longer CARMY_CONSOLE_SESSION, since lowered: it ends with the new setting.
            return None
        return session if session.expires > now else None

    def csrf(self, session: Session) -> str:
        """The token every form of this session carries: HMAC(secret, "csrf:" + session id)."""
        return _b64(self._mac(b"csrf", session.sid.encode()))

    def csrf_matches(self, session: Session, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.csrf(session).encode())

    def new(self, *, principal: str | None, signed_in: bool, lifetime: int) -> Session:
        """A fresh session (a new id at every sign-in: an id seen before it is worth nothing after)."""
        return Session(sid=secrets.token_urlsafe(18), principal=principal, signed_in=signed_in,
                       expires=int(self._clock()) + lifetime)


class Sessions:
    """The console's ``Signer``, keyed with the configured secret or the one shared through Redis
    (read on first use, not at start: the API starts while Redis is down).

    The shared secret is asserted again every ``SECRET_RECHECK_S``: should Redis lose it (a restart
    without its files), the replicas agree on one again within that time, rather than each keep
    its own while a new replica writes another.
    """

    def __init__(self, settings: ApiSettings, redis: Redis, clock: Callable[[], float] = time.time) -> None:
        self.lifetime = settings.console_session
        self.secure = settings.console_secure_cookies
        self._redis = redis
        self._clock = clock
        secret = settings.console_secret
        self._fixed = Signer(secret.encode(), clock, self.lifetime) if secret else None
        self._shared: Signer | None = None
        self._secret = b""
        self._checked = 0.0  # time.monotonic() of the last reading of the shared secret

    async def signer(self) -> Signer:
        """Raises what the Redis client raises when the shared secret cannot be read on first use (a
        failed recheck keeps the secret already known)."""
        if self._fixed is not None:
            return self._fixed
        known = self._shared
        if known is not None and time.monotonic() - self._checked < SECRET_RECHECK_S:
            return known
        try:
            secret = await shared_secret(self._redis, self._secret or secrets.token_bytes(32))
        except Exception:
            if known is None:
                raise
            self._checked = time.monotonic()  # Redis is away: sign as before, ask again in a while
            return known
        self._checked = time.monotonic()
        if known is None or secret != self._secret:
            self._secret, known = secret, Signer(secret, self._clock, self.lifetime)
            self._shared = known
        return known

    def name(self, *, https: bool) -> str:
        """The cookie's name for a request over ``https`` (or not): the only one read from it."""
        return SECURE_COOKIE if https or self.secure else COOKIE

    def cookie(self, value: str, *, https: bool, path: str) -> str:
        """A ``Set-Cookie`` value. ``SameSite=Strict``: no other site's page or link brings it along.
        Over HTTPS (or when a proxy ends TLS) ``__Host-carmy_console``, ``Secure``, ``Path=/`` (see
        ``SECURE_COOKIE``); else ``carmy_console`` at the console's ``path`` (``/console``, under the
        mount's prefix): ``/agent/*`` never sees it."""
        return self._cookie(value, f"Max-Age={self.lifetime}", https=https, path=path)

    def clearing_cookie(self, *, https: bool, path: str) -> str:
        return self._cookie("", "Max-Age=0", https=https, path=path)

    def _cookie(self, value: str, max_age: str, *, https: bool, path: str) -> str:
        if self.name(https=https) == SECURE_COOKIE:
            return f"{SECURE_COOKIE}={value}; Path=/; {max_age}; HttpOnly; SameSite=Strict; Secure"
        return f"{COOKIE}={value}; Path={path}; {max_age}; HttpOnly; SameSite=Strict"
