"""The API's side of jobs, whichever door a request came in by (``/agent/jobs`` or MCP's
``carmy_job``): create one after the checks a call passes, read, list, cancel, and an
operator's retry and purge. Refusals are data (``Rejected``, with the error the caller gets).

A job is its creator's: anyone else gets the same ``JOB_NOT_FOUND`` as for an id that never
existed, unless it holds the operator's permission (``ApiSettings.operator_permission``), which
sees, retries and purges everyone's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from urllib.parse import urlsplit

from redis.asyncio import Redis

from api.calling import instants
from api.calling.calls import Calls
from api.calling.checks import Rejected, rate_limited
from api.settings import ApiSettings
from carmy_worker.sdk.context import AgentContext
from carmy_worker.sdk.errors import clip, error, store_full
from carmy_worker.settings import NotifySettings
from carmy_worker.store import keys
from carmy_worker.store.durable import Durability
from carmy_worker.store.joblists import Cursor, Page
from carmy_worker.store.jobstore import JobState, JobStore, job_fields
from carmy_worker.store.memory import StoreMemory
from carmy_worker.store.submit import Submission
from carmy_worker.wire import (
    JOB_STATUSES,
    ErrorBody,
    ExecutionJob,
    JobRequest,
    NotifyRequest,
    canonical_json_encoder,
    msgpack_encoder,
)

MAX_ATTEMPTS = 100  # the most attempts a request may ask for (a tool's retry policy has the same bound)
MAX_LIST = 1000  # the most jobs one list returns
MAX_NOTIFY_URL = 2048
NOTIFY_EVENTS = ("succeeded", "failed", "dead_lettered", "cancelled")  # a callback's events: the final statuses


@dataclass(frozen=True)
class NewJob:
    """A job as created, or found again by its request id (``created`` False)."""

    job: JobState
    created: bool


class Jobs:
    def __init__(self, redis: Redis, settings: ApiSettings, calls: Calls, *, durability: Durability | None = None,
                 memory: StoreMemory | None = None) -> None:
        self.settings = settings
        self.calls = calls
        self.store = JobStore(redis, durability=durability)
        self.memory = memory

    def is_operator(self, agent: AgentContext) -> bool:
        return self.settings.operator_permission in agent.permissions

    async def create(self, request: JobRequest, agent: AgentContext) -> NewJob:
        """Check ``request`` as a call is checked (tool, policy, request id, arguments), then its
        schedule, then queue it (limits: the horizon, the caller's unfinished jobs, its rate)."""
        admitted = self.calls.admit(request.tool, request.arguments, request.request_id, agent)
        tool = admitted.tool
        run_at_ms = _run_at(request)
        max_attempts = _max_attempts(request, tool.retry.max_attempts)
        notify = _notify(request.notify, self.settings.notify)
        arguments = canonical_json_encoder.encode(admitted.arguments)
        template = ExecutionJob(
            execution_id="", tool=tool.spec.name, arguments=arguments, principal=agent.principal,
            session=agent.session, permissions=sorted(agent.permissions), metadata=agent.metadata,
        )
        owner = keys.owner(agent.principal)
        # A principal with a quota has its jobs in its home partition, where its bucket is and its
        # limit on unfinished jobs is exact; any other's spread, as its calls do (store.jobstore).
        quota = self.settings.quotas.of(agent.principal)
        idempotency = None if admitted.request_id is None else keys.job_idempotency(
            agent.principal, agent.session, admitted.request_id, homed=quota.bounded)
        job_id = JobStore.new_job_id(owner, quota, idempotency)
        fields = job_fields(
            tool=tool.spec.name, owner=owner, payload=msgpack_encoder.encode(template), policy=tool.retry,
            max_attempts=max_attempts, idempotent=tool.spec.idempotent, retention=self.settings.jobs_retention,
            dead_retention=self.settings.dead_letter_retention, request_id=admitted.request_id, notify=notify,
        )
        created = await self.store.create(
            job_id=job_id, tool=tool.spec.name, owner=owner, fields=fields, idempotency=idempotency,
            fingerprint=_fingerprint(request, arguments, notify), run_at_ms=run_at_ms, delay_ms=request.delay_ms or 0,
            horizon_ms=self.settings.jobs_horizon * 1000, max_open=self.settings.jobs_max_open,
            quota=quota, room=self.memory is None or self.memory.room,
        )
        if created.kind == "conflict":
            raise Rejected(error(
                "IDEMPOTENCY_CONFLICT", "This request_id was already used for a job with another body.",
                suggested_action="use a new request_id for a different job", details={"job_id": created.job_id}))
        if created.kind == "store_full":
            if self.memory is not None:
                self.memory.refused()
            raise Rejected(store_full())
        if created.kind == "too_far":
            raise Rejected(error(
                "INVALID_REQUEST", f"The job would be due {-(-created.count // 1000)} s from now, past the horizon of "
                f"{self.settings.jobs_horizon} s.",
                details={"field": "run_at" if request.run_at is not None else "delay_ms",
                         "horizon_s": self.settings.jobs_horizon}))
        if created.kind == "limited":
            if created.limit == "jobs":
                # Without a quota, each partition holds a share of the limit: the one this job fell in is full.
                shared = "" if quota.bounded or keys.partition_count() == 1 else " (a share of it in each partition)"
                raise Rejected(error(
                    "RATE_LIMITED", f"This caller is at its limit of {self.settings.jobs_max_open} unfinished jobs"
                    f"{shared}; try again once some have finished.",
                    retry_after=max(1, created.retry_after_ms // 1000),
                    details={"limit": "jobs"}))
            raise Rejected(rate_limited(Submission("limited", limit=created.limit,
                                                   retry_after_ms=created.retry_after_ms)))
        job = await self.store.read(created.job_id)
        if job is None:  # pragma: no cover - created, or found by its request id, a moment ago
            raise Rejected(error("JOB_NOT_FOUND", "The job was created but can no longer be read."))
        return NewJob(job, created.kind == "new")

    async def find(self, job_id: str, agent: AgentContext) -> JobState | None:
        """The job if it exists and the caller may see it (its creator, or an operator)."""
        if not keys.is_job_id(job_id):
            return None
        job = await self.store.read(job_id)
        if job is None or (job.owner != keys.owner(agent.principal) and not self.is_operator(agent)):
            return None
        return job

    async def get(self, job_id: str, agent: AgentContext) -> JobState:
        job = await self.find(job_id, agent)
        if job is None:
            raise Rejected(not_found())
        return job

    async def cancel(self, job_id: str, agent: AgentContext) -> JobState:
        """Cancel: a queued job never starts; a running one's execution is cancelled and no
        attempt follows (it still ends ``succeeded`` if it completed first). A finished job is
        left as it is. The job as it is afterwards."""
        job = await self.get(job_id, agent)
        outcome, execution_id = await self.store.cancel(job)
        if outcome == "running" and execution_id is not None:
            await self.calls.executions.cancel(execution_id, job.tool)
        return await self.store.read(job_id) or job

    async def retry(self, job_id: str, agent: AgentContext) -> JobState:
        """An operator queues a failed or dead-lettered job again, with a fresh budget of attempts."""
        if not self.is_operator(agent):
            raise Rejected(operator_required())
        job = await self.get(job_id, agent)
        outcome = await self.store.retry(job)
        if outcome == "gone":
            raise Rejected(not_found())
        if outcome != "retried":
            raise Rejected(error("JOB_NOT_RETRYABLE", f"Only a failed or dead-lettered job can be retried; this one "
                                                      f"is {outcome}.", details={"status": outcome}))
        return await self.store.read(job_id) or job

    async def purge(self, job_id: str, agent: AgentContext) -> None:
        """An operator removes a finished job (a dead letter it will not retry) before its
        retention is over."""
        if not self.is_operator(agent):
            raise Rejected(operator_required())
        job = await self.get(job_id, agent)
        outcome = await self.store.purge(job)
        if outcome == "gone":
            raise Rejected(not_found())
        if outcome == "notifying":
            raise Rejected(error("JOB_NOT_FINISHED", "This job's callback is still being delivered; purge it once "
                                                     "its notify state is delivered or undeliverable.",
                                 details={"status": job.status, "notify": "pending"}))
        if outcome != "purged":
            raise Rejected(error("JOB_NOT_FINISHED", f"Only a finished job can be purged; this one is {outcome}.",
                                 suggested_action="cancel it first", details={"status": outcome}))

    async def list(self, agent: AgentContext, *, status: str | None, limit: int) -> list[JobState]:
        """The caller's jobs newest first (everyone's for an operator), ``status`` only if given."""
        return (await self.page(agent, status=status, limit=limit)).jobs

    async def page(self, agent: AgentContext, *, status: str | None, limit: int, cursor: str | None = None) -> Page:
        """``list``, from where the page ``cursor`` (``Page.after``, as text) ended."""
        after = None if cursor is None else Cursor.parse(cursor)
        if cursor is not None and after is None:
            raise Rejected(error("INVALID_REQUEST", "cursor must be the next_cursor of a list's page.",
                                 details={"field": "cursor"}))
        if status is not None and status not in JOB_STATUSES:
            raise Rejected(error("INVALID_REQUEST", f"status must be one of {', '.join(JOB_STATUSES)}.",
                                 details={"field": "status"}))
        if not 1 <= limit <= MAX_LIST:
            raise Rejected(error("INVALID_REQUEST", f"limit must be 1 to {MAX_LIST}.", details={"field": "limit"}))
        owner = None if self.is_operator(agent) else keys.owner(agent.principal)
        return await self.store.list(owner=owner, status=status, limit=limit, after=after)


def not_found() -> ErrorBody:
    return error("JOB_NOT_FOUND", "No such job (or it expired).")


def operator_required() -> ErrorBody:
    return error("OPERATOR_REQUIRED", "Only an operator may do this: the caller's context must grant the "
                                      "operator's permission.", suggested_action="ask an operator")


def _run_at(request: JobRequest) -> int | None:
    """``run_at`` as unix ms (None: ``delay_ms`` from now, or now), refused unless exactly one
    form is used and it is well formed."""
    if request.run_at is not None and request.delay_ms is not None:
        raise Rejected(error("INVALID_REQUEST", "Give run_at or delay_ms, not both.", details={"field": "run_at"}))
    if request.delay_ms is not None and request.delay_ms < 0:
        raise Rejected(error("INVALID_REQUEST", "delay_ms must be 0 or more.", details={"field": "delay_ms"}))
    if request.run_at is None:
        return None
    at = instants.read_rfc3339(request.run_at)
    if at is None:
        raise Rejected(error(
            "INVALID_REQUEST", f"run_at must be an RFC 3339 date-time with an offset, such as "
            f"2026-12-24T18:00:00Z; got {clip(request.run_at)!r}.", details={"field": "run_at"}))
    if not instants.FIRST_MS <= at <= instants.LAST_MS:  # 0001-01-01T00:00:00+14:00 is in year 0 in UTC: it has no view
        raise Rejected(error("INVALID_REQUEST", f"run_at must fall in the years 0001 to 9999 in UTC; got "
                                                f"{clip(request.run_at)!r}.", details={"field": "run_at"}))
    return at


def _max_attempts(request: JobRequest, default: int) -> int:
    if request.max_attempts is None:
        return default
    if not 1 <= request.max_attempts <= MAX_ATTEMPTS:
        raise Rejected(error("INVALID_REQUEST", f"max_attempts must be 1 to {MAX_ATTEMPTS}.",
                             details={"field": "max_attempts"}))
    return request.max_attempts


def _notify(notify: NotifyRequest | None, settings: NotifySettings) -> tuple[str, list[str]] | None:
    """The callback asked for, as (url, events), refused unless callbacks are configured, the URL
    is http(s) to a host ``CARMY_NOTIFY_HOSTS`` allows, and the events are final statuses."""
    if notify is None:
        return None

    def refuse(message: str, field: str) -> Rejected:
        return Rejected(error("INVALID_REQUEST", message, details={"field": field}))

    if not settings.enabled:
        raise refuse("Callbacks are not configured on this server (CARMY_NOTIFY_SECRET is not set).", "notify")
    url = notify.url
    if len(url.encode()) > MAX_NOTIFY_URL:
        raise refuse(f"notify.url must be at most {MAX_NOTIFY_URL} bytes.", "notify.url")
    # Printable ASCII without spaces, as RFC 3986 writes a URL: a space or a control character
    # would break the request line, urlsplit drops tabs and line breaks without a word (the URL
    # called would not be the one given), and anything else belongs percent-encoded.
    if not all("!" <= c <= "~" for c in url):
        raise refuse(f"notify.url must be printable ASCII without spaces (percent-encode the rest): {clip(url)!r}.",
                     "notify.url")
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").rstrip(".")
        _ = parts.port
    except ValueError:
        raise refuse(f"notify.url is not a URL: {clip(url)!r}.", "notify.url") from None
    if parts.scheme not in ("http", "https") or not host or parts.username is not None or parts.fragment:
        raise refuse("notify.url must be an http or https URL with a host, and no credentials or fragment.",
                     "notify.url")
    if not settings.allows_host(host):
        allowed = ", ".join(settings.hosts) or "none"
        raise refuse(f"notify.url's host {host} is not one callbacks may call (CARMY_NOTIFY_HOSTS: {allowed}).",
                     "notify.url")
    events = list(NOTIFY_EVENTS) if notify.events is None else notify.events
    if not events or len(set(events)) != len(events) or not set(events) <= set(NOTIFY_EVENTS):
        raise refuse(f"notify.events must be distinct final statuses: {', '.join(NOTIFY_EVENTS)}.", "notify.events")
    return url, [e for e in NOTIFY_EVENTS if e in events]


def _fingerprint(request: JobRequest, arguments: bytes, notify: tuple[str, list[str]] | None) -> str:
    """What makes two requests with the same request id the same job: the whole body."""
    body = canonical_json_encoder.encode({
        "tool": request.tool, "arguments": arguments.decode(), "run_at": request.run_at,
        "delay_ms": request.delay_ms, "max_attempts": request.max_attempts,
        **({} if notify is None else {"notify": list(notify)}),
    })
    return hashlib.sha256(body).hexdigest()
