"""The headers every console response carries (pages, redirects, refusals, static files).

The policy allows the console's own files and nothing else: no inline script or style (the
templates have none, and a test parses every page to hold that), no other host, no framing.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
# Referrer-Policy is "same-origin", not "no-referrer": under "no-referrer" browsers send
# "Origin: null" with a form's POST (Fetch, "serializing a request origin"), and every POST of
# the console must carry its real origin (guard.py). Other sites still get no referrer.
PAGE_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),  # frame-ancestors, for browsers that predate CSP 2
    (b"cross-origin-opener-policy", b"same-origin"),
)
# Pages show live state and CSRF tokens: never stored (static files set their own, long).
NO_STORE = (b"cache-control", b"no-store")


class ConsoleHeaders:
    """ASGI wrapper of everything under ``/console`` (``entrance.py``): ``PAGE_HEADERS``, and
    ``Cache-Control: no-store`` unless the route set its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", ()) if h[0].lower() not in dict(PAGE_HEADERS)]
                if not any(name.lower() == b"cache-control" for name, _ in headers):
                    headers.append(NO_STORE)
                message = {**message, "headers": [*headers, *PAGE_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
