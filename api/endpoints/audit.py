"""``GET /agent/audit?tool=&principal=&status=&since=&until=&limit=&cursor=``: the audit trail, for
operators (``api.calling.audit`` decides who and checks the filters), newest first, a page at a
time: ``{"entries": [...], "next_cursor": "..." | null}``.

A parameter sent empty (``tool=``) is as if not sent, so a form's blank field filters nothing;
others are ignored. Refusals are the envelope's ``{"error": ...}``: ``403 OPERATOR_REQUIRED``
before any parameter is looked at, then ``400 INVALID_REQUEST`` with ``details.field``. Every
answer is ``Cache-Control: no-store``: the trail grows under the URL.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from api.calling.audit import DEFAULT_LIMIT, Audit, AuditQuery, invalid
from api.endpoints.jobs import answer, json_response
from api.guards.auth import trusted_context
from carmy_worker.sdk.errors import clip
from carmy_worker.wire import is_digits

AUDIT_PATH = "/agent/audit"


class AuditRoutes:
    def __init__(self, *, audit: Audit) -> None:
        self.audit = audit

    async def list(self, request: Request) -> Response:
        async def work() -> Response:
            agent = trusted_context(request.scope)
            self.audit.check_operator(agent)
            return json_response(await self.audit.page(query_of(request), agent))

        return await answer(work)


def query_of(request: Request) -> AuditQuery:
    """The query string as an ``AuditQuery`` (``Rejected`` for a ``limit`` that is no number)."""
    params = request.query_params

    def given(name: str) -> str | None:
        return params.get(name, "").strip() or None

    limit = given("limit")
    if limit is not None and not is_digits(limit):
        raise invalid("limit", f"limit must be a whole number; got {clip(limit)!r}.")
    return AuditQuery(tool=given("tool"), principal=given("principal"),
                      status=given("status"),  # type: ignore[arg-type]  # reading() refuses another, naming it
                      since=offset_kept(given("since")), until=offset_kept(given("until")),
                      limit=DEFAULT_LIMIT if limit is None else int(limit), cursor=given("cursor"))


def offset_kept(value: str | None) -> str | None:
    """A time's ``+01:00`` offset as a query string sent unencoded carries it: a ``+`` there is
    a space (and an RFC 3339 time has no space, since ``T`` is required)."""
    return None if value is None else value.replace(" ", "+")
