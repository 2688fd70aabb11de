"""Who may see a console page, and which POSTs are the console's own.

Every route goes through a ``Guard``: ``page`` for a GET, ``action`` for a POST. A page needs a
signed-in session when the API authenticates (else a browser is sent to sign in, ``303``, and a
script gets ``401``); when it does not (``bin/run``'s loopback default), the console is open as
``/agent/*`` is, and an anonymous session is issued for its CSRF token. A link from another site
arrives without the ``SameSite=Strict`` cookie: its page only loads itself again. An action needs, in this
order: an ``Origin`` that is this server's own (a missing one too is refused: every browser sends
it with a POST), a valid session, and that session's CSRF token in the form. ``BrowserGuard``
has already checked ``Host`` (DNS rebinding) and refused any foreign ``Origin`` before this.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from api.console.render import CSRF_FIELD, home, render
from api.console.session import Session, Sessions, Signer
from api.console.visitor import SCOPE_KEY, Visitor
from api.guards.browser import same_origin
from api.http.fields import header
from api.http.paths import root

log = logging.getLogger("carmy.api")

Form = Mapping[str, str]
Page = Callable[[Request], Awaitable[Response]]
Action = Callable[[Request, Form], Awaitable[Response]]

SIGN_IN_PATH = "/console/sign-in"
MAX_FORM = 65536  # the console's forms hold a token and a few fields
FORM_TYPE = "application/x-www-form-urlencoded"


class Refused(Exception):
    """A request the guard answers itself, with a page saying why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def followed_from_another_site(request: Request) -> bool:
    """Whether a person followed a link from another site (a chat, a mail, any page) to here: the
    browser leaves the ``SameSite=Strict`` cookie home on that one navigation (Fetch Metadata)."""
    return (request.headers.get("sec-fetch-site") == "cross-site"
            and request.headers.get("sec-fetch-mode") == "navigate")


def wants_page(request: Request) -> bool:
    """Whether a person's browser navigates here (a redirect helps), rather than a script fetching."""
    return request.headers.get("sec-fetch-mode") == "navigate" or "text/html" in request.headers.get("accept", "")


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form body of at most ``MAX_FORM`` bytes (the only kind the console's forms
    send); an empty body is an empty form (it then lacks its CSRF token)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise Refused(413, "This form is larger than any of the console's.")
    if body and (request.headers.get("content-type") or "").split(";")[0].strip().lower() != FORM_TYPE:
        raise Refused(415, "The console's forms are sent urlencoded.")
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))


class Guard:
    """Builds the console's routes, each behind its checks (the console's headers are added to all of
    them by ``entrance.py``)."""

    def __init__(self, sessions: Sessions, *, authenticates: bool) -> None:
        self.sessions = sessions
        self.open = not authenticates

    def page(self, path: str, handler: Page, *, signed_in: bool = True) -> Route:
        """``GET path``, answered by ``handler`` for a visitor let in (``signed_in=False``: anyone)."""
        async def endpoint(request: Request) -> Response:
            try:
                signer = await self._signer()
                session = signer.open(self.sealed(request))
                if session is None and followed_from_another_site(request):
                    # The page loads itself again, now from the console's own origin, and the cookie
                    # comes along. Never a new cookie here: it would replace the operator's session
                    # (any site could sign them out) and send them to sign in again.
                    return render(request, "arriving.html")
                if session is not None and signed_in and not self.allowed(session):
                    session = None  # the sign-in form's anonymous session: not signed in yet
                fresh = None
                if session is None:
                    if signed_in and not self.open:
                        return self._send_to_sign_in(request)
                    session = fresh = signer.new(principal=None, signed_in=False, lifetime=self.sessions.lifetime)
                request.scope[SCOPE_KEY] = Visitor(session, signer.csrf(session), self.allowed(session))
                response = await handler(request)
            except Refused as refused:
                return refusal(request, refused)
            if fresh is not None:
                self.set_session(request, response, signer, fresh)
            return response

        return Route(path, endpoint, methods=["GET"])

    def action(self, path: str, handler: Action, *, signed_in: bool = True) -> Route:
        """``POST path``: its Origin, session and CSRF token checked before ``handler`` gets the form."""
        async def endpoint(request: Request) -> Response:
            try:
                signer, session, form = await self._checked(request)
                if signed_in and not self.allowed(session):
                    return self._send_to_sign_in(request)
                request.scope[SCOPE_KEY] = Visitor(session, signer.csrf(session), self.allowed(session))
                return await handler(request, form)
            except Refused as refused:
                return refusal(request, refused)

        return Route(path, endpoint, methods=["POST"])

    def allowed(self, session: Session) -> bool:
        """Whether ``session`` may see the console's pages."""
        return session.signed_in or self.open

    def sealed(self, request: Request) -> str | None:
        """The session cookie's value, by the one name this request's scheme reads it under (over HTTPS a
        plain ``carmy_console``, which any page of the site may have set, is not even looked at)."""
        return request.cookies.get(self.sessions.name(https=https(request)))

    def set_session(self, request: Request, response: Response, signer: Signer, session: Session) -> None:
        response.headers.append("set-cookie", self.sessions.cookie(signer.seal(session), https=https(request),
                                                                   path=home(request)))

    def clear_session(self, request: Request, response: Response) -> None:
        response.headers.append("set-cookie", self.sessions.clearing_cookie(https=https(request), path=home(request)))

    async def _checked(self, request: Request) -> tuple[Signer, Session, dict[str, str]]:
        origin = header(request.scope, b"origin")
        if origin is None or not same_origin(origin, header(request.scope, b"host")):
            raise Refused(403, "This form was not sent from this console's own pages.")
        signer = await self._signer()
        session = signer.open(self.sealed(request))
        if session is None:
            raise Refused(403, "Your console session has ended. Reload the page and try again.")
        form = await read_form(request)
        if not signer.csrf_matches(session, form.get(CSRF_FIELD)):
            raise Refused(403, "This form has expired or was not sent from this console. Reload the page and "
                               "try again.")
        return signer, session, form

    async def _signer(self) -> Signer:
        try:
            return await self.sessions.signer()
        except Exception as exc:  # the shared secret lives in Redis: whatever its client raises
            log.warning("console: the session secret cannot be read from Redis: %s", exc)
            raise Refused(503, "The console cannot reach Redis right now. Try again in a moment.") from exc

    def _send_to_sign_in(self, request: Request) -> Response:
        sign_in = root(request.scope) + SIGN_IN_PATH
        if wants_page(request):
            return RedirectResponse(sign_in, status_code=303)
        return JSONResponse({"error": {"code": "UNAUTHENTICATED", "message": f"Sign in at {sign_in}."}},
                            status_code=401)


def https(request: Request) -> bool:
    return request.url.scheme == "https"


def refusal(request: Request, refused: Refused) -> Response:
    """The page that tells a person why the console did not do what they asked."""
    return render(request, "refused.html", status=refused.status, message=refused.message)
