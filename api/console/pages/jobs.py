"""``/console/jobs``: the jobs by status (queued now, scheduled for later, running, dead-lettered,
failed, succeeded, cancelled; everyone's, as an operator sees them), and every schedule with its
next and last occurrence; ``/console/jobs/{job_id}``: one job, its attempts' executions, its last
error and what its result was (its size, not its data), with Retry and Cancel when they apply
(``jobactions.py`` asks for confirmation, then does them).

Everything is read through ``api.calling.jobs`` and ``api.calling.schedules``, as ``/agent/jobs``
and ``/agent/schedules`` read it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, get_args

from starlette.requests import Request
from starlette.responses import Response

from api.calling.checks import Rejected
from api.calling.jobs import Jobs
from api.calling.schedules import Schedules
from api.console.pages.operator import operator
from api.console.pages.unreachable import told_if_unreachable
from api.console.pages.wording import WORDING
from api.console.render import render
from carmy_worker.sdk.errors import ErrorCode
from carmy_worker.store.joblists import Cursor
from carmy_worker.store.jobstore import JobState

LIST_SIZE = 100
# The tabs, in order: (key, label, the store's status). "scheduled" and "queued" are both queued
# jobs, told apart by whether they are due yet.
TABS = (("queued", "Queued", "queued"), ("scheduled", "Scheduled", "queued"), ("running", "Running", "running"),
        ("dead_lettered", "Dead-lettered", "dead_lettered"), ("failed", "Failed", "failed"),
        ("succeeded", "Succeeded", "succeeded"), ("cancelled", "Cancelled", "cancelled"), ("all", "All", None))
RETRYABLE = frozenset({"failed", "dead_lettered"})  # what Jobs.retry accepts
CANCELLABLE = frozenset({"queued", "running"})
# What a button's POST came to (``jobactions.py``), named in the job page's URL: a fixed list, so
# that a link someone crafts cannot put words of its own on the page.
# The codes ?refused= may name (an action's refusal, from its redirect): any other word in a
# crafted link would be shown to the operator as the console's own.
ERROR_CODES = frozenset(get_args(ErrorCode))
DONE = {
    "retried": "Retried: the job is queued again, with a fresh budget of attempts.",
    "cancelled": "Cancelled.",
    "cancelling": "Cancelling: its worker is stopping the running attempt; the job ends cancelled, or succeeded "
                  "if the attempt completed first.",
    "finished": "Nothing to cancel: the job had already finished.",
    "not_retryable": "Not retried: only a failed or dead-lettered job can be retried.",
}


def error_of(raw: bytes | None) -> dict[str, Any] | None:
    """An error body (JSON) as a dict, None if there is none."""
    if raw is None:
        return None
    try:
        found = json.loads(raw)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


@dataclass(frozen=True)
class JobRow:
    """A job as the pages show it."""

    job: JobState
    now_ms: int

    @property
    def scheduled(self) -> bool:
        return self.job.status == "queued" and self.job.due_ms > self.now_ms

    @property
    def next_ms(self) -> int | None:
        """When its next attempt is due, while it waits for one."""
        return self.job.due_ms if self.job.status == "queued" else None

    @property
    def last_error(self) -> dict[str, Any] | None:
        return error_of(self.job.last_error)

    @property
    def last_error_code(self) -> str | None:
        error = self.last_error
        return None if error is None else str(error.get("code") or "")

    @property
    def last_error_details(self) -> str | None:
        error = self.last_error
        details = None if error is None else error.get("details")
        return None if details is None else json.dumps(details, indent=2, ensure_ascii=False)

    @property
    def result(self) -> dict[str, Any] | None:
        """Its final result body's status and error, or the size of its data (never the data)."""
        body = error_of(self.job.result)
        if body is None:
            return None
        data = body.get("data")
        return {"status": body.get("status"), "error": body.get("error") if isinstance(body.get("error"), dict)
                else None, "data_bytes": None if data is None else len(json.dumps(data, separators=(",", ":")))}

    @property
    def retryable(self) -> bool:
        return self.job.status in RETRYABLE

    @property
    def cancellable(self) -> bool:
        return self.job.status in CANCELLABLE


def now_ms() -> int:
    return int(time.time() * 1000)


class JobsPage:
    """The list (with the schedules) and a job's page."""

    def __init__(self, jobs: Jobs, schedules: Schedules) -> None:
        self.jobs = jobs
        self.schedules = schedules

    @told_if_unreachable
    async def get(self, request: Request) -> Response:
        """``GET /console/jobs?status=&cursor=``: a page of LIST_SIZE jobs, the older ones from
        the page's cursor on (every partition's, merged: ``store.joblists``)."""
        tab = request.query_params.get("status", "queued")
        key, label, status = next((t for t in TABS if t[0] == tab), TABS[0])
        agent = operator(request, self.jobs.settings.operator_permission)
        cursor = request.query_params.get("cursor")
        if cursor is not None and Cursor.parse(cursor) is None:
            cursor = None  # a link edited by hand: the newest page
        now = now_ms()
        page = await self.jobs.page(agent, status=status, limit=LIST_SIZE, cursor=cursor)
        rows = [JobRow(job, now) for job in page.jobs]
        # Whether the list was cut at LIST_SIZE: before queued jobs are split into due and scheduled.
        cut = len(rows) >= LIST_SIZE
        if status == "queued":
            rows = [row for row in rows if row.scheduled == (key == "scheduled")]
        older = page.after.text() if cut and page.after is not None else None
        return render(request, "jobs.html", tabs=TABS, tab=key, label=label, rows=rows, limit=LIST_SIZE, cut=cut,
                      queued=status == "queued", cursor=cursor, older=older, schedules=await self.schedules.list(),
                      **WORDING)

    @told_if_unreachable
    async def job(self, request: Request) -> Response:
        """``GET /console/jobs/{job_id}``."""
        agent = operator(request, self.jobs.settings.operator_permission)
        try:
            job = await self.jobs.get(request.path_params["job_id"], agent)
        except Rejected:
            return render(request, "not_found.html", status=404, what="job",
                          message="No job has this id, or it has expired: a finished job is kept for "
                                  "CARMY_JOBS_RETENTION (7 days by default), a dead letter for "
                                  "CARMY_DEAD_LETTER_RETENTION (30 days).")
        done = request.query_params.get("done", "")
        refused = request.query_params.get("refused", "")
        return render(request, "job.html", row=JobRow(job, now_ms()), done=DONE.get(done),
                      refused=refused if refused in ERROR_CODES else None, **WORDING)
