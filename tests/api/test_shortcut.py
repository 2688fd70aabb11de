"""``POST /agent/execute`` skips Starlette's router, not the app's middleware."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.app import create_app
from tests.conftest import asgi_client
from tests.support import Stack, app_settings


class Stamp:
    """A host's middleware, added to Carmy's app itself: it marks every answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"x-host", b"stamped")]}
            await send(message)

        await self.app(scope, receive, stamped)


async def test_middleware_a_host_adds_sees_execute_calls(stack: Stack) -> None:
    app = create_app(app_settings(stack.redis_url, security_headers=True))
    app.add_middleware(Stamp)
    async with asgi_client(app) as client:
        r = await client.post("/agent/execute", content=b"{", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "INVALID_REQUEST"
        assert r.headers["x-host"] == "stamped"
        assert r.headers["x-frame-options"] == "DENY"  # the app's own middleware too
        # The browser guard, before anything is read.
        r = await client.post("/agent/execute", json={"tool": "noop"}, headers={"origin": "https://evil.example"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "ORIGIN_NOT_ALLOWED"
        # Other methods on the path still go through the router.
        r = await client.get("/agent/execute")
        assert r.status_code == 405 and r.headers["allow"] == "POST" and r.headers["x-host"] == "stamped"
