"""A job's Retry and Cancel buttons, in two steps that work without JavaScript: ``GET
/console/jobs/{job_id}/retry`` (or ``/cancel``) is a page that says what will happen, with a form
that POSTs to the same URL (its CSRF token in it, its origin checked by the guard); the POST does
it through ``api.calling.jobs``, as ``/agent/jobs`` does, as the signed-in operator, and answers
``303`` to the job's page, which says what came of it (``?done=`` or ``?refused=<code>``).

Cancel does not wait for a running attempt to stop, as ``DELETE /agent/jobs`` does for a few
seconds: the job's page says it is being cancelled, and a reload shows how it ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from api.calling.checks import Rejected
from api.calling.jobs import Jobs
from api.console.guard import Action, Form, Page
from api.console.pages.jobs import JobRow, now_ms
from api.console.pages.operator import operator
from api.console.pages.unreachable import told_if_unreachable
from api.console.pages.wording import WORDING
from api.console.render import home, render
from carmy_worker.store.jobstore import FINISHED

Kind = Literal["retry", "cancel"]


@dataclass(frozen=True)
class JobActions:
    """The confirmation pages and the POSTs of Retry and Cancel."""

    jobs: Jobs

    def confirm(self, action: Kind) -> Page:
        @told_if_unreachable
        async def page(request: Request) -> Response:
            """``GET /console/jobs/{job_id}/<action>``: what it will do, and the button that does it."""
            job_id = request.path_params["job_id"]
            try:
                job = await self.jobs.get(job_id, operator(request, self.jobs.settings.operator_permission))
            except Rejected:
                return render(request, "not_found.html", status=404, what="job",
                              message="No job has this id, or it has expired.")
            return render(request, "job_confirm.html", action=action, row=JobRow(job, now_ms()), **WORDING)

        return page

    def do(self, action: Kind) -> Action:
        @told_if_unreachable
        async def post(request: Request, form: Form) -> Response:
            """``POST /console/jobs/{job_id}/<action>``: done, then back to the job's page."""
            job_id = request.path_params["job_id"]
            agent = operator(request, self.jobs.settings.operator_permission)
            try:
                if action == "retry":
                    await self.jobs.retry(job_id, agent)
                    done = "retried"
                else:
                    before = await self.jobs.get(job_id, agent)
                    after = await self.jobs.cancel(job_id, agent)
                    done = "finished" if before.status in FINISHED else \
                        "cancelled" if after.status in FINISHED else "cancelling"
            except Rejected as refused:
                if refused.error.code == "JOB_NOT_FOUND":
                    return render(request, "not_found.html", status=404, what="job",
                                  message="No job has this id, or it has expired.")
                query = {"done": "not_retryable"} if refused.error.code == "JOB_NOT_RETRYABLE" \
                    else {"refused": refused.error.code}
                return RedirectResponse(f"{home(request)}/jobs/{job_id}?{urlencode(query)}", status_code=303)
            return RedirectResponse(f"{home(request)}/jobs/{job_id}?done={done}", status_code=303)

        return post
