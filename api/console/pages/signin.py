"""Signing in and out: a key or access token pasted once for a session cookie.

The token is checked by the API's own ``Authenticator`` (API keys and OAuth access tokens alike)
and must carry the operator permission. A wrong token gets one message whatever was wrong with
it; the token itself is never kept, logged or shown again.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from api.console.guard import SIGN_IN_PATH, Form, Guard
from api.console.render import home, render
from api.guards.auth import Authenticator
from api.guards.oauth.tokens import Refusal
from api.http.paths import root
from carmy_worker.sdk.context import AgentContext

log = logging.getLogger("carmy.api")

MAX_TOKEN = 8192  # longer than any API key or JWT this server accepts


class SignIn:
    """``GET`` and ``POST /console/sign-in``, ``POST /console/sign-out``."""

    def __init__(self, guard: Guard, auth: Authenticator | None, operator_permission: str) -> None:
        self.guard = guard
        self.auth = auth
        self.operator = operator_permission

    async def form(self, request: Request) -> Response:
        if self.auth is None:  # nothing to sign in with: the console is open (see guard.py)
            return RedirectResponse(home(request), status_code=303)
        return self._form(request)

    async def sign_in(self, request: Request, form: Form) -> Response:
        if self.auth is None:
            return RedirectResponse(home(request), status_code=303)
        token = form.get("token", "").strip()
        found = None
        if token and len(token) <= MAX_TOKEN and token.isprintable():
            found = await self.auth.identify(b"Bearer " + token.encode(), mcp=False)
        if isinstance(found, Refusal) and found.error == "unavailable":
            return self._form(request, 503, "The access token cannot be checked right now (the issuer's keys "
                                            "cannot be fetched). Try again in a moment.")
        if not isinstance(found, AgentContext):
            # Worth an operator's notice (guessing goes on here); the token itself is never logged.
            log.info("console: sign-in refused, the token is not a valid key or access token")
            return self._form(request, 401, "This is not a valid API key or access token.")
        if self.operator not in found.permissions:
            log.info("console: sign-in refused to %s, who lacks %s", found.principal, self.operator)
            return self._form(request, 403, f"This key lacks the operator permission ({self.operator}): "
                                            "the console is for operators.")
        signer = await self.guard.sessions.signer()
        session = signer.new(principal=found.principal or "operator", signed_in=True,
                             lifetime=self.guard.sessions.lifetime)
        log.info("console: %s signed in", session.principal)
        response = RedirectResponse(home(request), status_code=303)
        self.guard.set_session(request, response, signer, session)
        return response

    async def sign_out(self, request: Request, form: Form) -> Response:
        response = RedirectResponse(root(request.scope) + SIGN_IN_PATH if self.auth is not None else home(request),
                                    status_code=303)
        self.guard.clear_session(request, response)
        return response

    def _form(self, request: Request, status: int = 200, message: str | None = None) -> Response:
        return render(request, "sign_in.html", status=status, message=message, permission=self.operator)
