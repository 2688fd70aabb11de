"""Where this app is served from the outside: the path prefix a mount, or a server behind a
proxy, puts before its routes (ASGI's ``root_path``: ``/carmy`` under Starlette's
``Mount("/carmy", app=carmy)``, empty when ``python -m api`` serves it). Every URL the app hands
out (a ``Location``, discovery's links) carries it, so that a client that follows one reaches
this app and not the one around it."""

from __future__ import annotations

from starlette.types import Scope


def root(scope: Scope) -> str:
    """The prefix, without a trailing slash; '' at the server's root."""
    return str(scope.get("root_path") or "").rstrip("/")
