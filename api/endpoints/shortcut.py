"""The app: Starlette, with its busiest route answered before Starlette's own layers.

Every execution is a ``POST /agent/execute``. Through Starlette it passes ServerErrorMiddleware,
ExceptionMiddleware, the router (which tries each route's pattern in turn) and the route, and its
answer through two ``send`` wrappers: together about a tenth of the API's CPU per execution
under load (bench/README.md, "API hot path"). ``CarmyApp`` sends that request straight to the
route's app inside the app's own middleware (``user_middleware``: security headers, CORS, the
browser guard, and any a host adds with ``add_middleware``).

What it skips is nothing this route relies on: the route raises no ``HTTPException``, and an
error nobody caught is answered ``500 Internal Server Error`` (text) by uvicorn instead of by
ServerErrorMiddleware, the same answer but for a ``Connection: close`` that both imply (the
connection is closed after either). Every other request, including another method on the same
path (``405``), goes through Starlette as before.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from api.guards.browser import route_path


class CarmyApp(Starlette):
    """A Starlette app whose ``POST`` to ``shortcut_path`` goes to ``shortcut`` without the router
    (see the module). ``shortcut`` should also be the app of that path's route."""

    def __init__(self, *, shortcut_path: str, shortcut: ASGIApp, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shortcut_path = shortcut_path
        self._shortcut = shortcut
        self._shortcut_stack: ASGIApp | None = None  # built on first use, like Starlette's own stack

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and route_path(scope) == self.shortcut_path:
            scope["app"] = self
            stack = self._shortcut_stack
            if stack is None:
                stack = self._shortcut_stack = self._wrapped(self._shortcut)
            await stack(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def _wrapped(self, app: ASGIApp) -> ASGIApp:
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        return app
