"""Where every request under ``/console`` comes in: one route of the app's router that takes the
whole path, routes it among the console's own routes, and answers whatever happens with the
console's headers (``headers.py``) and, when no page answers, a page a person can read.

Starlette's own answers are text without those headers (``404 Not Found``, ``405 Method Not
Allowed``) or, for a fault, its server error (``500``, text too). Here an unknown path is the
console's 404 page, a method its routes do not take a 405 page (with ``Allow``), and an exception
before the answer started a 500 page that says nothing of the fault: its traceback goes to the log.
What ``BrowserGuard`` refuses before any route (a foreign ``Host`` or ``Origin``) is a page too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, NoMatchFound, Route, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.console.headers import ConsoleHeaders
from api.console.render import HOME, render
from api.guards.browser import route_path

log = logging.getLogger("carmy.api")

FAULT = ("Something went wrong in the console while answering this. It is logged on the server; "
         "try again in a moment.")


def under_console(path: str) -> bool:
    return path == HOME or path.startswith(HOME + "/")


def not_found(request: Request) -> Response:
    return render(request, "not_found.html", status=404, what="page",
                  message="The console has no page at this address.")


def not_allowed(request: Request, allow: str) -> Response:
    return render(request, "refused.html", status=405, heading="Not here", headers={"allow": allow},
                  message=f"This address of the console does not take {request.method}: only {allow}.")


def fault(request: Request) -> Response:
    return render(request, "refused.html", status=500, heading="Something went wrong", message=FAULT)


def refused_by_browser_guard(scope: Scope, code: str, message: str) -> ASGIApp | None:
    """``BrowserGuard``'s refusal (a foreign ``Host`` or ``Origin``) of a request under ``/console``: a
    page with the console's headers, where ``/agent/*`` gets the JSON envelope (None)."""
    if not under_console(route_path(scope)):
        return None
    return ConsoleHeaders(render(Request(scope), "refused.html", status=403, message=message))


class Answers:
    """ASGI: the console's router, with what it does not answer itself answered by a page."""

    def __init__(self, routes: Sequence[BaseRoute]) -> None:
        self.router = Router(list(routes), default=self._not_found)

    async def _not_found(self, scope: Scope, receive: Receive, send: Send) -> None:
        await not_found(Request(scope))(scope, receive, send)

    def allowed(self, scope: Scope) -> str:
        """Every method some route takes at this path (Starlette's ``Allow`` names the first route's only:
        a job's ``/retry`` takes GET and POST)."""
        methods: set[str] = set()
        for route in self.router.routes:
            if isinstance(route, Route) and route.methods and route.matches(scope)[0] is not Match.NONE:
                methods |= route.methods
        return ", ".join(sorted(methods))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.router(scope, receive, sending)
        except Exception as exc:
            if started:
                raise  # a stream already under way (/console/live): nothing more can be said
            request = Request(scope)
            if isinstance(exc, HTTPException) and exc.status_code == 405:  # a route of another method
                response = not_allowed(request, self.allowed(scope))
            elif isinstance(exc, HTTPException) and exc.status_code == 404:
                response = not_found(request)
            else:
                log.exception("console: %s %r failed", request.method, request.url.path)  # %r: no newline of theirs
                response = fault(request)
            await response(scope, receive, send)


class ConsoleEntrance(BaseRoute):
    """The app's one route for ``/console`` and everything under it (see the module)."""

    def __init__(self, routes: Sequence[BaseRoute]) -> None:
        self.routes = list(routes)
        self.app = ConsoleHeaders(Answers(self.routes))

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and under_console(route_path(scope)):
            return Match.FULL, {}
        return Match.NONE, {}

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any) -> Any:
        raise NoMatchFound(name, path_params)
