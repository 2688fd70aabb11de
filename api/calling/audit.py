"""The API's side of the audit trail, whichever door asks (``GET /agent/audit``, MCP's
``carmy_audit``): only operators read it, and a query's filters are checked into the store's
``AuditFilter``. Refusals are data (``Rejected``): ``OPERATOR_REQUIRED`` before anything else,
then ``INVALID_REQUEST`` with ``details.field`` naming the first filter that is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, get_args

import msgspec
from msgspec import Meta
from redis.asyncio import Redis

from api.calling import instants
from api.calling.checks import Rejected
from api.calling.jobs import Jobs, operator_required
from carmy_worker.sdk.context import AgentContext
from carmy_worker.sdk.errors import clip, error
from carmy_worker.store.audit import AuditFilter, AuditTrail, is_cursor
from carmy_worker.wire import AuditEntries, Status, is_digits

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
STATUSES: tuple[str, ...] = get_args(Status)
# The latest instant a filter takes: 15 digits of ms (the year 33658), as entry ids have at most.
MAX_MS = 10**15 - 1

Instant = Annotated[str | int | None, Meta(
    description="An RFC 3339 date-time with an offset (2026-12-02T10:00:00Z) or Unix milliseconds.")]


class AuditQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Which entries of the audit trail to read, newest first: each filter given must match
    exactly; ``since`` and ``until`` bound when the entries were written (inclusive)."""

    tool: Annotated[str | None, Meta(description="Only entries of this tool.")] = None
    principal: Annotated[str | None, Meta(description="Only entries of this caller.")] = None
    status: Annotated[Status | None, Meta(description="Only entries of this outcome.")] = None
    since: Instant = None
    until: Instant = None
    limit: Annotated[int, Meta(ge=1, le=MAX_LIMIT, description="Entries at most in this page.")] = DEFAULT_LIMIT
    cursor: Annotated[str | None, Meta(description="The next_cursor of the page before: older entries.")] = None


@dataclass(frozen=True)
class Reading:
    """A query checked: what the store is asked for."""

    wanted: AuditFilter
    limit: int
    cursor: str | None


def reading(query: AuditQuery) -> Reading:
    """``query`` checked (``Rejected`` naming the first field that is wrong)."""
    if query.status is not None and query.status not in STATUSES:
        raise invalid("status", f"status must be one of {', '.join(STATUSES)}.")
    if not 1 <= query.limit <= MAX_LIMIT:
        raise invalid("limit", f"limit must be 1 to {MAX_LIMIT}.")
    if query.cursor is not None and not is_cursor(query.cursor):
        raise invalid("cursor", "cursor must be a next_cursor a page answered.")
    since, until = instant(query.since, "since"), instant(query.until, "until")
    if since is not None and until is not None and until < since:
        raise invalid("until", "until is before since.")
    wanted = AuditFilter(tool=query.tool, principal=query.principal, status=query.status, since_ms=since,
                         until_ms=until)
    return Reading(wanted, query.limit, query.cursor)


def instant(value: str | int | None, field: str) -> int | None:
    """Unix ms of ``value``: Unix ms already (as a number or its digits), or RFC 3339 with an offset."""
    if value is None:
        return None
    if isinstance(value, str) and is_digits(value):
        value = int(value)
    if isinstance(value, int):
        if not 0 <= value <= MAX_MS:
            raise invalid(field, f"{field} must be Unix milliseconds from 0 to {MAX_MS}.")
        return value
    if len(value) > 6 and value[-6] == " ":
        # A "+01:00" sent in a query without percent-encoding arrives as " 01:00".
        value = f"{value[:-6]}+{value[-5:]}"
    at = instants.read_rfc3339(value)
    if at is None:
        raise invalid(field, f"{field} must be an RFC 3339 date-time with an offset, such as 2026-12-02T10:00:00Z, "
                             f"or Unix milliseconds; got {clip(value)!r}.")
    return max(0, at)


def invalid(field: str, message: str) -> Rejected:
    return Rejected(error("INVALID_REQUEST", message, details={"field": field}))


class Audit:
    """Reads of the audit trail, for operators only (``Jobs.is_operator``)."""

    def __init__(self, redis: Redis, jobs: Jobs) -> None:
        self.trail = AuditTrail(redis)
        self.jobs = jobs

    def check_operator(self, agent: AgentContext) -> None:
        """``OPERATOR_REQUIRED`` unless ``agent`` is an operator."""
        if not self.jobs.is_operator(agent):
            raise Rejected(operator_required())

    async def page(self, query: AuditQuery, agent: AgentContext) -> AuditEntries:
        """One page of entries that match ``query``, newest first (an operator's only)."""
        self.check_operator(agent)
        checked = reading(query)
        page = await self.trail.page(checked.wanted, limit=checked.limit, cursor=checked.cursor)
        return AuditEntries(entries=page.entries, next_cursor=page.cursor)
