"""Jobs over HTTP (``api.calling.jobs`` does the work):

* ``POST /agent/jobs``: a call to run later, again after a failure that may pass, checked now as
  a call is; ``202`` and the job, with its ``Location``. The same ``request_id`` and body again:
  ``200`` and the same job.
* ``GET /agent/jobs/{job_id}``: the job; ``GET /agent/jobs?status=&limit=&cursor=``: the caller's jobs,
  newest first (everyone's for an operator), a page at a time (``next_cursor``).
* ``DELETE /agent/jobs/{job_id}``: cancel it; a running job ends once its worker has stopped
  the execution, which this waits a few seconds for (``202`` if it has not yet).
* ``POST /agent/jobs/{job_id}/retry``: an operator queues a failed or dead-lettered job again.
* ``POST /agent/jobs/{job_id}/purge``: an operator removes a finished job (a dead letter it will
  not retry) before its retention is over: ``204``.
* ``GET /agent/schedules``: the recurring jobs the workers declare.

Refusals are the envelope's ``{"error": ...}`` with the error's status. Every answer is
``Cache-Control: no-store``: a job changes under its URL.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from api.calling.checks import Rejected
from api.calling.jobs import Jobs
from api.calling.schedules import Schedules
from api.guards.auth import trusted_context
from api.guards.body import BodyTooLarge, ClientGone, read_body
from api.http import bodies
from api.http.paths import root
from api.http.responses import NO_STORE, envelope, envelope_error
from api.settings import ApiSettings
from carmy_worker.sdk.context import AgentContext
from carmy_worker.sdk.errors import clip, store_unavailable
from carmy_worker.store.jobstore import FINISHED, JobState
from carmy_worker.wire import JobRequest, is_digits, json_encoder

log = logging.getLogger("carmy.api")

JOBS_PATH = "/agent/jobs"
DEFAULT_LIMIT = 50
# How long DELETE waits for a running job to end (its worker stops the execution, then a job
# loop concludes the attempt), and how often it looks.
CANCEL_WAIT_S = 5.0
CANCEL_POLL_S = 0.05

job_request_decoder = msgspec.json.Decoder(JobRequest)


def location(job_id: str, scope: Scope) -> str:
    """Where a job is read, under the app's ``root``."""
    return f"{root(scope)}{JOBS_PATH}/{job_id}"


def job_response(job: JobState, status_code: int = 200, *, located: Scope | None = None) -> Response:
    """The job's view; ``located``: with its ``Location``, for the request of this scope."""
    headers = {**NO_STORE, "location": location(job.job_id, located)} if located is not None else NO_STORE
    return Response(json_encoder.encode(job.view()), status_code, headers, media_type="application/json")


def json_response(body: object) -> Response:
    return Response(json_encoder.encode(body), 200, NO_STORE, media_type="application/json")


def decode_job_request(body: bytes) -> JobRequest | str:
    """The request, or why it is malformed (an unknown field's name included)."""
    return bodies.decode(job_request_decoder, body)


async def answer(work: Callable[[], Awaitable[Response]]) -> Response:
    """``work``'s response, or the error that refused it: a ``Rejected`` as its envelope, Redis
    out of reach as ``STORE_UNAVAILABLE``."""
    try:
        return await work()
    except Rejected as rejected:
        return envelope(rejected.error)
    except (RedisError, OSError) as exc:
        log.warning("store unavailable: %s", exc)
        return envelope(store_unavailable())


class JobRoutes:
    def __init__(self, *, settings: ApiSettings, jobs: Jobs, schedules: Schedules) -> None:
        self.settings = settings
        self.jobs = jobs
        self.schedules = schedules

    async def create(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI, to read the body with the same limit as execute (and answer nothing to a
        client that left while sending it)."""
        try:
            body = await read_body(scope, receive, self.settings.max_body)
        except BodyTooLarge:
            response = envelope_error("PAYLOAD_TOO_LARGE", f"The body exceeds {self.settings.max_body} bytes.")
            return await response(scope, receive, send)
        except ClientGone:
            return None
        request = decode_job_request(body)
        if isinstance(request, str):
            response = envelope_error("INVALID_REQUEST", "The request body is not a valid job request.",
                                      reason=request)
        else:
            response = await answer(lambda: self._create(request, scope))
        await response(scope, receive, send)

    async def _create(self, request: JobRequest, scope: Scope) -> Response:
        new = await self.jobs.create(request, trusted_context(scope))
        return job_response(new.job, 202 if new.created else 200, located=scope)

    async def get(self, request: Request) -> Response:
        async def work() -> Response:
            return job_response(await self.jobs.get(request.path_params["job_id"], trusted_context(request.scope)))

        return await answer(work)

    async def delete(self, request: Request) -> Response:
        async def work() -> Response:
            agent = trusted_context(request.scope)
            job = await self.jobs.cancel(request.path_params["job_id"], agent)
            if job.status not in FINISHED:  # it was running: its worker is stopping it
                job = await self._ended(job, agent)
            if job.status not in FINISHED:
                response = job_response(job, 202, located=request.scope)
                response.headers["retry-after"] = "1"
                return response
            return job_response(job)

        return await answer(work)

    async def _ended(self, job: JobState, agent: AgentContext) -> JobState:
        """``job`` once it has finished, or as it is after ``CANCEL_WAIT_S``."""
        deadline = time.monotonic() + CANCEL_WAIT_S
        while job.status not in FINISHED and time.monotonic() < deadline:
            await asyncio.sleep(CANCEL_POLL_S)
            job = await self.jobs.find(job.job_id, agent) or job
        return job

    async def list(self, request: Request) -> Response:
        async def work() -> Response:
            status = request.query_params.get("status")
            limit = request.query_params.get("limit")
            if limit is not None and not is_digits(limit.strip()):
                return envelope_error("INVALID_REQUEST", "limit must be a whole number.", reason=clip(limit))
            page = await self.jobs.page(trusted_context(request.scope), status=status,
                                        limit=DEFAULT_LIMIT if limit is None else int(limit),
                                        cursor=request.query_params.get("cursor"))
            return json_response({"jobs": [job.view() for job in page.jobs],
                                  "next_cursor": None if page.after is None else page.after.text()})

        return await answer(work)

    async def retry(self, request: Request) -> Response:
        async def work() -> Response:
            return job_response(await self.jobs.retry(request.path_params["job_id"], trusted_context(request.scope)))

        return await answer(work)

    async def purge(self, request: Request) -> Response:
        async def work() -> Response:
            await self.jobs.purge(request.path_params["job_id"], trusted_context(request.scope))
            return Response(status_code=204, headers=NO_STORE)

        return await answer(work)

    async def list_schedules(self, request: Request) -> Response:
        async def work() -> Response:
            return json_response({"schedules": await self.schedules.list()})

        return await answer(work)
