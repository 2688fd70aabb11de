"""One route for every method a path takes.

Given a route per method at one path, Starlette's router answers another method with the first
route's ``405``, whose ``Allow`` names that route's methods only (``GET, HEAD`` where ``DELETE``
is taken too). RFC 9110 has ``Allow`` list what the path takes: one route, one list.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send


class MethodApps:
    """ASGI: each method's own app (``HEAD`` is ``GET``'s, as Starlette answers it)."""

    def __init__(self, apps: Mapping[str, ASGIApp]) -> None:
        self.apps = dict(apps)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        await self.apps["GET" if method == "HEAD" else method](scope, receive, send)


def by_method(path: str, apps: Mapping[str, ASGIApp]) -> Route:
    """``path`` answered by ``apps``, one per method; any other method is ``405`` naming them all."""
    return Route(path, MethodApps(apps), methods=list(apps))
