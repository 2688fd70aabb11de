"""Server-rendered pages: one jinja2 environment (autoescaped, templates from ``templates/``) and
``render``, which every page answers with.

A page template extends ``base.html`` and fills ``title`` and ``content`` (and ``scripts``, with
``<script src>`` only: the policy refuses inline code). ``render`` gives every template the
visitor, its CSRF token (``{{ csrf_field() }}`` in every form), the nav, ``static(name)`` and
``home``, the console's path as the browser sees it (a link is ``{{ home }}/jobs``, never
``/console/jobs``: the app may be mounted under a prefix).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse

from api.console.assets import static_url
from api.console.visitor import visitor
from api.guards.browser import route_path
from api.http.paths import root

TEMPLATES_DIR = Path(__file__).parent / "templates"
CSRF_FIELD = "csrf"  # the name of every form's hidden token field


HOME = "/console"


@dataclass(frozen=True)
class NavItem:
    label: str
    href: str


# The console's sections, in the order the nav shows them (their paths inside the app).
NAV = (
    NavItem("Overview", HOME),
    NavItem("Executions", HOME + "/executions"),
    NavItem("Jobs", HOME + "/jobs"),
    NavItem("Tools", HOME + "/tools"),
)

environment = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
    autoescape=True,  # every value is escaped unless a template marks it safe
    undefined=jinja2.StrictUndefined,  # a misspelt name fails the render (and the tests), not silently
    trim_blocks=True,
    lstrip_blocks=True,
    auto_reload=False,
)
environment.globals["static"] = static_url  # a fragment's (render gives a page the mount's prefix too)


def current(path: str, href: str) -> bool:
    """Whether the nav's ``href`` is the section ``path`` is in."""
    return path == href if href == HOME else path == href or path.startswith(href + "/")


def home(request: Request) -> str:
    """The console's URL path as the browser sees it: ``/console`` under the prefix the app is
    served from (``root_path``: ``/carmy/console`` under ``Mount("/carmy", ...)``). Every link,
    form, redirect and script source of the console starts with it."""
    return root(request.scope) + HOME


def fragment(template: str, **context: Any) -> Markup:
    """A part of a page that is the same for every visitor (no nav, no CSRF token), rendered once
    and kept by its page, then put in with ``{{ name }}``: it is already escaped."""
    return Markup(environment.get_template(template).render(**context))


def render(request: Request, template: str, *, status: int = 200, headers: Mapping[str, str] | None = None,
           **context: Any) -> HTMLResponse:
    """``template`` rendered for this request's visitor, as an HTML response."""
    seen = visitor(request)
    csrf = seen.csrf if seen is not None else ""
    prefix, path = root(request.scope), route_path(request.scope)
    page = environment.get_template(template).render(
        visitor=seen,
        csrf=csrf,
        csrf_field=lambda: Markup('<input type="hidden" name="{}" value="{}">').format(CSRF_FIELD, csrf),
        nav=[(NavItem(item.label, prefix + item.href), current(path, item.href)) for item in NAV],
        home=prefix + HOME,
        static=lambda name: prefix + static_url(name),
        **context,
    )
    return HTMLResponse(page, status_code=status, headers=headers)
