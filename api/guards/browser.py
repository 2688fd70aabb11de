"""What keeps a browser from being turned against the API.

Without API keys (``bin/run``'s default) a call needs nothing a web page cannot send, so:

* ``BrowserGuard`` refuses a ``Host`` the API does not answer to (DNS rebinding: a page whose
  name resolves to 127.0.0.1 is "same origin" with the API, so only the name it asked for gives
  it away) and an ``Origin`` that is neither an allowed CORS origin nor the API's own (a page of
  another site). Both ``403``, before authentication and before the body is read. A request
  without ``Origin`` (curl, agents, SDKs) passes: browsers send one with every cross-site
  request that could do harm here. The probes (``/health``, ``/ready``) are left open: they are
  read-only, and orchestrators call them by whatever address they know (Kubernetes sends the
  pod's IP as ``Host``).
* ``RequireJson`` refuses a ``POST`` body that is not JSON (``415``): ``text/plain``, form and
  multipart bodies are the ones a page may send cross-site without a CORS preflight.

The MCP specification makes the ``Origin`` check a MUST for Streamable HTTP servers.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from api.http.fields import header
from api.http.responses import envelope_error
from api.settings import ApiSettings
from carmy_worker.sdk.errors import ErrorCode, clip
from carmy_worker.wire import is_digits

PROBES = frozenset({"/health", "/ready"})
HOSTS_REMEMBERED = 64  # Host values whose verdict BrowserGuard keeps
DEFAULT_PORTS = {"http": 80, "https": 443}


def split_host(value: str) -> tuple[str, int | None] | None:
    """``Host`` (or an allow-list entry) as (lower-case name without brackets, port), or None if
    it is not a host."""
    value = value.strip().lower()
    if value.startswith("["):  # an IPv6 literal: [::1]:8000
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:]
    elif value.count(":") > 1:  # a bare IPv6 literal, as an allow-list may give it
        name, port = value, ""
    else:
        name, _, port = value.partition(":")
    if not name or (port and not is_digits(port)):
        return None
    return name.rstrip("."), int(port) if port else None


class HostPattern:
    """One entry of ``CARMY_ALLOWED_HOSTS``: a name (any port), ``name:port``, ``*.domain`` or ``*``."""

    def __init__(self, entry: str) -> None:
        self.any = entry == "*"
        self.suffix = entry[1:].lower() if entry.startswith("*.") else None
        self.host = None if self.any or self.suffix else split_host(entry)

    def matches(self, name: str, port: int | None) -> bool:
        if self.any:
            return True
        if self.suffix is not None:
            return name.endswith(self.suffix)
        return self.host is not None and self.host[0] == name and self.host[1] in (None, port)


# How a refusal is told at a request's path: given the scope, the error code and the message, an
# answer, or None for the JSON envelope (the console's pages tell theirs as a page: api/app.py).
Refusal = Callable[[Scope, ErrorCode, str], ASGIApp | None]


class BrowserGuard:
    """ASGI middleware: ``403 HOST_NOT_ALLOWED`` / ``403 ORIGIN_NOT_ALLOWED`` (see the module)."""

    def __init__(self, app: ASGIApp, settings: ApiSettings, refusal: Refusal | None = None) -> None:
        self.app = app
        self.refusal = refusal
        self.hosts = [HostPattern(entry) for entry in settings.hosts_allowed()]
        self.any_host = any(p.any for p in self.hosts)
        self.origins = {origin.rstrip("/") for origin in settings.cors_origins}
        self.any_origin = "*" in self.origins
        self._hosts_seen: dict[str, bool] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or route_path(scope) in PROBES:
            return await self.app(scope, receive, send)
        host = header(scope, b"host")
        origin = header(scope, b"origin")
        if not self.any_host and host is not None and not self.host_allowed(host):
            return await self.refuse(scope, "HOST_NOT_ALLOWED", f"This server does not answer to the host "
                                     f"{clip(host)!r}: it is not in CARMY_ALLOWED_HOSTS.")(scope, receive, send)
        if origin is not None and not self.origin_allowed(origin, host):
            return await self.refuse(scope, "ORIGIN_NOT_ALLOWED", f"Requests from {clip(origin)!r} are not allowed: "
                                     "only the server's own origin and CARMY_CORS_ORIGINS are.")(scope, receive, send)
        await self.app(scope, receive, send)

    def refuse(self, scope: Scope, code: ErrorCode, message: str) -> ASGIApp:
        told = self.refusal(scope, code, message) if self.refusal is not None else None
        return told if told is not None else envelope_error(code, message)

    def host_allowed(self, host: str) -> bool:
        # Every request asks, with one of a handful of values: the answer is remembered, for
        # the first HOSTS_REMEMBERED values seen (any Host a client invents is still checked).
        allowed = self._hosts_seen.get(host)
        if allowed is None:
            split = split_host(host)
            allowed = split is not None and any(p.matches(*split) for p in self.hosts)
            if len(self._hosts_seen) < HOSTS_REMEMBERED:
                self._hosts_seen[host] = allowed
        return allowed

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        return self.any_origin or origin in self.origins or same_origin(origin, host)


def same_origin(origin: str, host: str | None) -> bool:
    """Whether ``origin`` names the host and port the request was sent to (``Host``).

    The scheme is not compared: behind a TLS-terminating proxy the API sees http for a page
    served over https. A ``Host`` without a port stands for the default port of the origin's
    scheme.
    """
    if host is None:
        return False
    try:
        parts = urlsplit(origin)
        origin_port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return False
    target = split_host(host)
    if parts.hostname is None or origin_port is None or target is None:
        return False  # "null" (a sandboxed frame, a file) is never the server's own origin
    name, port = target
    return parts.hostname.rstrip(".") == name and (port or DEFAULT_PORTS.get(parts.scheme)) == origin_port


def route_path(scope: Scope) -> str:
    """The path inside this app, also when it is mounted under a prefix."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def is_json(content_type: str | None) -> bool:
    """``application/json`` or any ``application/...+json``, with any parameters (charset)."""
    if content_type is None:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    # A structured syntax suffix needs a subtype before it (RFC 6838, 4.2.8): not "application/+json".
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json")
                                           and len(media) > len("application/+json"))


class RequireJson:
    """Wraps a route's ASGI app: a ``POST`` whose body is not JSON gets ``415
    UNSUPPORTED_MEDIA_TYPE`` before the body is read; other methods pass."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        content_type = header(scope, b"content-type")
        if scope["method"] == "POST" and not is_json(content_type):
            sent = (f"Content-Type {clip(content_type)}" if content_type and content_type.strip()
                    else "no Content-Type" if content_type is None else "an empty Content-Type")
            response = envelope_error("UNSUPPORTED_MEDIA_TYPE", "The body must be JSON: Content-Type: "
                                      "application/json.", reason=sent, headers={"accept": "application/json"})
            return await response(scope, receive, send)
        await self.app(scope, receive, send)
