"""A page of another origin, as a site an operator visits while signed in to the console would
serve: a form posting to the console, submitted by the page's own script as soon as it loads.

Served by a server of its own on another port. Reached as ``127.0.0.1`` it is same-site with the
API (a site ignores the port) but another origin: the browser sends even a ``SameSite=Strict``
cookie along, and only the console's Origin check and CSRF token stand in the way. Reached as
``localhost`` it is cross-site as well, and the cookie stays home."""

from __future__ import annotations

import html
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from playwright.sync_api import Page
from playwright.sync_api import Response as BrowserResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from tests.support import serving

SAME_SITE, CROSS_SITE = "127.0.0.1", "localhost"


@dataclass
class Attacker:
    """The server's base URL (on 127.0.0.1) and the pages it serves, by path."""

    base: str
    pages: dict[str, str] = field(default_factory=dict)

    def form_post(self, action: str, fields: dict[str, str], host: str = SAME_SITE) -> str:
        """The URL of a page, reached as ``host``, that POSTs ``fields`` to ``action`` (an absolute
        URL) as an HTML form (application/x-www-form-urlencoded) once loaded."""
        inputs = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                         for k, v in fields.items())
        path = f"/form-{len(self.pages)}"
        self.pages[path] = (f'<!doctype html><title>Win a prize</title><form method="post" '
                            f'action="{html.escape(action)}">{inputs}</form>'
                            "<script>document.forms[0].submit()</script>")
        return self.url(path, host)

    def link_to(self, href: str, host: str = SAME_SITE) -> str:
        """The URL of a page, reached as ``host``, with one link (``#link``) to ``href``: a chat's or
        a mail's, say, that a person follows."""
        path = f"/link-{len(self.pages)}"
        self.pages[path] = f'<!doctype html><title>An alert</title><a id="link" href="{html.escape(href)}">the job</a>'
        return self.url(path, host)

    def url(self, path: str, host: str = SAME_SITE) -> str:
        return f"http://{host}:{urlsplit(self.base).port}{path}"

    def attack(self, page: Page, action: str, fields: dict[str, str], host: str = SAME_SITE) -> BrowserResponse:
        """Have ``page`` visit a page of this site, reached as ``host``, that posts ``fields`` to
        ``action`` as it loads; the answer to that POST, as the browser got it."""
        with page.expect_response(lambda r: r.url == action and r.request.method == "POST") as posted:
            # Only until the attacker's page arrives: its script replaces it at once with the POST,
            # whose answer is what is waited for.
            page.goto(self.form_post(action, fields, host), wait_until="commit")
        response = posted.value
        # The refusal's page loaded: a navigation the test starts next cannot race it.
        page.wait_for_url(action)
        assert response.request.headers["origin"] == self.url("", host), "the browser sent no Origin"
        return response


@contextmanager
def attacker_site() -> Iterator[Attacker]:
    attacker = Attacker("")

    async def page(request: Request) -> Response:
        body = attacker.pages.get(request.url.path)
        return HTMLResponse(body) if body is not None else Response(status_code=404)

    with serving(Starlette(routes=[Route("/{path:path}", page)])) as base:
        attacker.base = base
        yield attacker
