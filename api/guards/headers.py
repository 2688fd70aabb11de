"""Optional response headers: browser security headers and CORS, both off by default.

Both are pure ASGI middleware, so SSE streams pass through unbuffered. Security headers are the
outer layer: CORS preflight answers carry them too.
"""

from __future__ import annotations

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.settings import ApiSettings

# The API serves JSON and event streams, never documents a browser should render or embed.
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    # A JSON error echoing user input is never sniffed into HTML or script.
    (b"x-content-type-options", b"nosniff"),
    # Opened directly in a browser, a response may load nothing and may not be framed.
    (b"content-security-policy", b"default-src 'none'; frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),  # frame-ancestors, for browsers that predate CSP 2
    (b"referrer-policy", b"no-referrer"),  # URLs (execution ids) never leak to other sites
    # Other sites cannot pull responses in with <script>/<img> (no-cors); CORS reads, which
    # CORS_* governs, are unaffected.
    (b"cross-origin-resource-policy", b"same-origin"),
)

CORS_METHODS = ("GET", "POST", "DELETE")
CORS_REQUEST_HEADERS = ("Authorization", "Content-Type", "Accept", "Prefer", "If-None-Match")
CORS_EXPOSED_HEADERS = ("ETag", "Retry-After", "Location")
CORS_MAX_AGE = 600  # seconds a browser may cache a preflight answer


class SecurityHeaders:
    """Adds ``SECURITY_HEADERS`` to every HTTP response; a header the app set itself is kept."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {name.lower() for name, _ in headers}
                headers.extend(h for h in SECURITY_HEADERS if h[0] not in present)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def middleware(settings: ApiSettings) -> list[Middleware]:
    """What ``settings`` turn on, outermost first, for ``Starlette(middleware=...)``."""
    stack: list[Middleware] = []
    if settings.security_headers:
        stack.append(Middleware(SecurityHeaders))
    if settings.cors_origins:
        stack.append(Middleware(
            CORSMiddleware,
            # A browser's Origin never ends with "/": tolerate one in the setting.
            allow_origins=[origin.rstrip("/") for origin in settings.cors_origins],
            allow_methods=CORS_METHODS,
            allow_headers=CORS_REQUEST_HEADERS,
            expose_headers=CORS_EXPOSED_HEADERS,
            # Callers authenticate with a bearer token they send themselves, never with cookies:
            # credentialed CORS would only widen what another origin can do.
            allow_credentials=False,
            max_age=CORS_MAX_AGE,
        ))
    return stack


def wrap(app: ASGIApp, settings: ApiSettings) -> ASGIApp:
    """``app`` inside the middleware ``settings`` turn on; ``app`` itself when both are off."""
    for cls, args, kwargs in reversed(middleware(settings)):
        app = cls(app, *args, **kwargs)
    return app
