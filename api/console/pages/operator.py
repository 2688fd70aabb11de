"""Who the console acts as when a page reads or changes jobs through ``api.calling.jobs``: the
signed-in person, with the operator's permission. Every visitor the guard lets in is an operator:
signed in with a key that has the permission, or on a console that is open because the API
authenticates nobody (as ``/agent/*`` is then open to anyone who reaches it)."""

from __future__ import annotations

from starlette.requests import Request

from api.console.visitor import visitor
from carmy_worker.sdk.context import AgentContext


def operator(request: Request, permission: str) -> AgentContext:
    """The context of ``request``'s visitor, as an operator holding ``permission``."""
    seen = visitor(request)
    return AgentContext(principal=None if seen is None else seen.principal, permissions=frozenset({permission}))
