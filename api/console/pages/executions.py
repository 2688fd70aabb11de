"""``/console/executions``: the newest entries of the audit trail, a page of 50 at a time, filtered
by tool, status and principal (a GET form, so a filtered page is a link to share), with an
"older" link carrying the trail's cursor.

The store looks at ``SCAN_AT_MOST`` entries at most for one page, so the page stays fast however
long the trail is: a filter that matches something rare may come back short, and the page then
says so and links to where to look further. ``/console/executions/rows`` is the table's body
alone, which ``executions.js`` fetches every second so that new calls appear without a reload.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from api.calling.audit import STATUSES
from api.calling.catalog import Catalog
from api.console.pages.unreachable import told_if_unreachable
from api.console.pages.wording import WORDING
from api.console.render import render
from carmy_worker.store import audit
from carmy_worker.store.audit import AuditFilter, AuditPage, AuditTrail, is_cursor

PAGE_SIZE = 50
# Entries one page looks at, at most (the store's bound, 10,000): about 0.1 s of Redis and
# decoding. A rarer match than one in this many comes back short, with "look further".
SCAN_AT_MOST = audit.SCAN_AT_MOST
MAX_FILTER = 200  # longer than any tool name or principal worth typing


@dataclass(frozen=True)
class Query:
    """The list's filters and place, as its URL says them (what is wrong in it is dropped)."""

    tool: str | None = None
    status: str | None = None
    principal: str | None = None
    cursor: str | None = None

    @property
    def filtered(self) -> bool:
        return any((self.tool, self.status, self.principal))

    def link(self, path: str, **changes: str | None) -> str:
        """This query's URL at ``path``, with ``changes``."""
        fields = {k: v for k, v in vars(replace(self, **changes)).items() if v}
        return path + ("?" + urlencode(fields) if fields else "")


def query_of(request: Request) -> Query:
    params = request.query_params

    def given(name: str) -> str | None:
        value = params.get(name, "").strip()
        return value if value and len(value) <= MAX_FILTER and value.isprintable() else None

    status, cursor = given("status"), given("cursor")
    return Query(tool=given("tool"), principal=given("principal"), status=status if status in STATUSES else None,
                 cursor=cursor if cursor is not None and is_cursor(cursor) else None)


class ExecutionsPage:
    """The list and its rows, over the audit trail and the catalog (for the tool filter's choices)."""

    def __init__(self, trail: AuditTrail, catalog: Catalog) -> None:
        self.trail = trail
        self.catalog = catalog

    async def read(self, query: Query) -> AuditPage:
        wanted = AuditFilter(tool=query.tool, status=query.status, principal=query.principal)
        return await self.trail.page(wanted, limit=PAGE_SIZE, cursor=query.cursor, scan_at_most=SCAN_AT_MOST)

    @told_if_unreachable
    async def get(self, request: Request) -> Response:
        """``GET /console/executions``: the page."""
        query = query_of(request)
        page = await self.read(query)
        tools = sorted({*self.catalog.view.tools, *([query.tool] if query.tool else [])})
        return render(request, "executions.html", query=query, page=page, entries=page.entries, tools=tools,
                      statuses=STATUSES, short=len(page.entries) < PAGE_SIZE and page.cursor is not None,
                      scanned=SCAN_AT_MOST, **WORDING)

    @told_if_unreachable
    async def rows(self, request: Request) -> Response:
        """``GET /console/executions/rows``: the table's body alone, for the page's refresh."""
        query = query_of(request)
        page = await self.read(query)
        return render(request, "executions_rows.html", query=query, entries=page.entries, **WORDING)
