"""``/console/executions/{execution_id}``: one execution for the person on call: its timeline
(queued, started, its newest progress message, finished), who called it by which door, the worker
that ran it, its error with the details, its job, and its audit entries (its own and its replays).

What an execution returned may be sensitive: for a success the page says only that it completed
and how large its data is; for a failure it shows the error part of the result body. The
arguments are never read. Its hash and record live ``CARMY_RETENTION`` (24 h by default), its
audit entries longer: once the hash has expired the page is built from its entries, found from
the list's link (``?at=``, the entry's id, bounds the search), and without either it is a 404.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Any

import msgspec
from redis.asyncio import Redis
from starlette.requests import Request
from starlette.responses import Response

from api.console.pages.unreachable import told_if_unreachable
from api.console.pages.wording import WORDING
from api.console.render import render
from carmy_worker.store import audit, keys
from carmy_worker.store.audit import AuditFilter, AuditPage, AuditTrail, is_cursor
from carmy_worker.store.inspection import Inspected, inspect
from carmy_worker.wire import AuditEntry, Record

SCAN_AT_MOST = audit.SCAN_AT_MOST  # audit entries looked at for this execution's, at most
MAX_ENTRIES = 50


@dataclass(frozen=True)
class Step:
    """One moment of the timeline."""

    label: str
    ms: int | None
    note: str = ""


@dataclass(frozen=True)
class Outcome:
    """What the record says, without the data: its status, and its error or the size of its data."""

    status: str
    http_status: int | None
    error_code: str | None = None
    message: str | None = None
    category: str | None = None
    details: str | None = None  # pretty JSON
    data_bytes: int | None = None


def outcome_of(record: Record) -> Outcome:
    """The record's status and error part; of a success's data only its size."""
    try:
        body: Any = json.loads(record.body)
    except ValueError:
        body = {}
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        details = error.get("details")
        return Outcome(record.status, record.status_code, error_code=str(error.get("code") or record.error_code),
                       message=str(error.get("message") or ""), category=error.get("category"),
                       details=None if details is None else json.dumps(details, indent=2, ensure_ascii=False))
    data = body.get("data") if isinstance(body, dict) else None
    return Outcome(record.status, record.status_code, error_code=record.error_code,
                   data_bytes=None if data is None else len(msgspec.json.encode(data)))


def ms_of(rfc3339: str | None) -> int | None:
    if not rfc3339:
        return None
    return round(datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


def timeline(found: Inspected | None, own: AuditEntry | None) -> list[Step]:
    """Its moments, from its hash while it is kept, else from its audit entry."""
    if found is not None:
        steps = [Step("Queued", found.queued_ms, f"by {found.via}" if found.via else "")]
        if found.started_ms is not None:
            steps.append(Step("Started", found.started_ms, f"on {found.worker}" if found.worker else ""))
        if found.message is not None:
            steps.append(Step("Progress", found.message_ms, found.message))
        if found.record is not None or found.ended_ms is not None:
            steps.append(Step("Finished", found.ended_ms, found.record.status if found.record else ""))
        return steps
    if own is None:
        return []
    started = ms_of(own.started_at)
    queued = None if started is None or own.queued_ms is None else started - own.queued_ms
    return [s for s in (Step("Queued", queued, f"by {own.via}" if own.via else ""),
                        Step("Started", started, f"on {own.worker}" if own.worker else ""),
                        Step("Finished", ms_of(own.finished_at), own.status)) if s.ms is not None]


class ExecutionPage:
    """The page, over the execution's hash and record (``store.inspection``) and the audit trail."""

    def __init__(self, redis: Redis, trail: AuditTrail) -> None:
        self.redis = redis
        self.trail = trail

    async def entries(self, exec_id: str, since_ms: int | None) -> AuditPage:
        """Its entries, newest first, among the newest ``SCAN_AT_MOST`` written since ``since_ms``."""
        return await self.trail.page(AuditFilter(execution_id=exec_id, since_ms=since_ms), limit=MAX_ENTRIES,
                                     scan_at_most=SCAN_AT_MOST)

    @told_if_unreachable
    async def get(self, request: Request) -> Response:
        exec_id = request.path_params["execution_id"]
        if not keys.is_execution_id(exec_id):
            return render(request, "not_found.html", status=404, what="execution",
                          message="This is not an execution id (exec_ followed by a UUID).")
        found = await inspect(self.redis, exec_id)
        at = request.query_params.get("at", "")
        since = found.queued_ms if found is not None else int(at.split("-")[0]) if is_cursor(at) else None
        page = await self.entries(exec_id, since)
        own = next((e for e in reversed(page.entries) if not e.replayed), None)
        if found is None and not page.entries:
            return render(request, "not_found.html", status=404, what="execution",
                          message="No execution has this id, or it has expired: an execution is kept for "
                                  "CARMY_RETENTION (24 hours by default), its audit entries for "
                                  "CARMY_AUDIT_RETENTION.")
        # What the facts are read from: its hash, else its own entry, else (a link to one of its replays
        # once the own entry is older than the search) the oldest entry found.
        about = found if found is not None else own if own is not None else page.entries[-1]
        return render(request, "execution.html", exec_id=exec_id, found=found, about=about, entries=page.entries,
                      more=page.cursor is not None, shown=MAX_ENTRIES, scanned=SCAN_AT_MOST,
                      steps=timeline(found, own),
                      outcome=None if found is None or found.record is None else outcome_of(found.record),
                      **WORDING)
