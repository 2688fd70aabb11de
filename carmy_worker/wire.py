"""Every type that crosses a process boundary: HTTP bodies, queue payloads, pub/sub events,
records in Redis. Both packages import them from here.

Request bodies forbid unknown fields (the protocol says so). Queue and Redis types tolerate
them and give new fields defaults, so an API and a worker of different versions keep talking
during a rolling deploy.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType, field

Category = Literal[
    "validation", "permission", "not_found", "cancelled", "conflict", "internal", "capacity", "timeout"
]
Effect = Literal["none", "read", "write", "external_write", "destructive"]
Confirmation = Literal["none", "required"]
Status = Literal["completed", "failed", "cancelled", "timed_out"]
EventName = Literal["tool.started", "tool.progress", "tool.completed", "final"]

# --- HTTP ------------------------------------------------------------------------------------


class ExecuteRequest(Struct, forbid_unknown_fields=True):
    """The body of ``POST /agent/execute``.

    ``arguments`` may be any JSON value here: one that is not an object is refused later as
    ``INVALID_ARGUMENTS``, with a full result body like every other argument error, rather than
    as a malformed envelope (``api.calling.checks.check_arguments``).
    """

    tool: str
    arguments: Any = {}
    request_id: str | None = None


class JobRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    """The body of ``POST /agent/jobs``: a call to run later (``run_at``, RFC 3339 with an
    offset, or ``delay_ms`` from now; at once with neither), tried up to ``max_attempts`` times
    (default: the tool's retry policy)."""

    tool: str
    arguments: Any = {}
    request_id: str | None = None
    run_at: str | None = None
    delay_ms: int | None = None
    max_attempts: int | None = None
    notify: NotifyRequest | None = None


class NotifyRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    """A job's callback: POST its view to ``url`` when it reaches one of ``events`` (default:
    every final status), signed the Standard Webhooks way (docs/protocol.md, "Callbacks")."""

    url: str
    events: list[str] | None = None


class NotifyAttempt(Struct, kw_only=True, omit_defaults=True):
    """One attempt at delivering a callback: when, and the HTTP status it got or why it failed."""

    at: str
    status: int | None = None
    error: str | None = None


NotifyState = Literal["waiting", "pending", "delivered", "undeliverable"]


class NotifyView(Struct, kw_only=True):
    """A job's callback as its view shows it: ``state`` is ``waiting`` (the job has not reached
    one of ``events``), ``pending`` (being delivered, retried with backoff), ``delivered`` (a
    2xx answer) or ``undeliverable`` (refused address, or its window ran out); ``deliveries``:
    the latest attempts, oldest first."""

    url: str
    events: list[str]
    state: NotifyState = "waiting"
    delivered: bool = False
    deliveries: list[NotifyAttempt] = []


JobStatus = Literal["queued", "running", "succeeded", "failed", "dead_lettered", "cancelled"]
JOB_STATUSES: tuple[str, ...] = ("queued", "running", "succeeded", "failed", "dead_lettered", "cancelled")


class AuditEntry(Struct, kw_only=True):
    """One entry of the audit trail (docs/protocol.md, "Audit"): an execution that finished, or
    a finished execution replayed to a retry (``replayed``). Never its arguments, its output or
    a secret. ``id``: the entry's place in the trail (its cursor); times are RFC 3339 in UTC;
    ``queued_ms``: how long it waited for a worker; ``via``: the door it came in by (``http``,
    ``sse``, ``mcp``, ``webhook``, ``job``); ``worker``: the worker that ran it last, if any."""

    id: str
    execution_id: str
    request_id: str | None = None
    job_id: str | None = None
    principal: str | None = None
    tool: str
    effect: str | None = None
    status: str
    error_code: str | None = None
    duration_ms: int | None = None
    queued_ms: int | None = None
    started_at: str | None = None
    finished_at: str
    replayed: bool = False
    via: str | None = None
    worker: str | None = None


class AuditEntries(Struct, kw_only=True):
    """A page of the audit trail (``GET /agent/audit``, MCP's ``carmy_audit``): entries newest
    first, and ``next_cursor``, to send back as ``cursor`` for the older ones (null: no more)."""

    entries: list[AuditEntry]
    next_cursor: str | None = None


class JobView(Struct, kw_only=True):
    """A job as ``GET /agent/jobs/{job_id}`` shows it (docs/protocol.md, "Jobs").

    ``run_at``: when it is due (a retry's next attempt, while it waits for one); times are
    RFC 3339 in UTC. ``last_error``: the error of its latest attempt that failed; ``result``:
    the final attempt's result body once the job has finished (null before). ``executions``:
    each attempt's execution, oldest first.
    """

    job_id: str
    tool: str
    status: JobStatus
    request_id: str | None
    attempts: int
    max_attempts: int
    run_at: str
    created_at: str
    last_error: Any = None
    result: Any = None
    executions: list[str] = []
    schedule: str | None = None  # the schedule that queued it, if one did
    notify: NotifyView | None = None  # its callback, if it asked for one


class ScheduleView(Struct, kw_only=True):
    """One recurring job as ``GET /agent/schedules`` shows it: its definition, the occurrence it
    waits for (``next_run_at``) and its last job. Times are RFC 3339 in UTC, null (and the counts
    0) until a worker that declares it has taken it up."""

    name: str
    cron: str
    timezone: str
    tool: str
    grace_s: float
    next_run_at: str | None
    last_job_id: str | None
    last_run_at: str | None
    skipped: int  # occurrences missed by more than grace_s, not run
    fired: int  # occurrences that queued a job


class ErrorBody(Struct, omit_defaults=True, kw_only=True):
    """The protocol's error object; ``recoverable`` and ``retryable`` are always present."""

    code: str
    message: str
    category: Category
    recoverable: bool
    retryable: bool
    retry_after: int | None = None
    suggested_action: str | None = None
    details: Any = None


NextActionKind = Literal["retry", "reconcile"]


class NextAction(Struct, omit_defaults=True, kw_only=True):
    """One entry of ``_agent.next_actions``: what the agent can do next (docs/protocol.md, 4).

    ``retry``: send the call this answers again: the same ``tool`` and arguments, with the same
    ``request_id`` if ``same_request_id`` (the answer recorded nothing, so the retry runs or
    joins the call) or a new one otherwise (the old one now replays this answer); no sooner than
    ``after_ms``; and only once the caller holds ``requires`` when set (a permission a person
    grants). ``reconcile``: check the state ``tool`` would have changed before anything else.

    Neither the arguments nor the request id are repeated: the agent has them, and an answer
    never grows with what was sent.
    """

    action: NextActionKind
    tool: str
    same_request_id: bool | None = None
    after_ms: int | None = None
    requires: str | None = None


class AgentHints(Struct):
    cacheable: bool
    next_actions: list[NextAction]


class ResultBody(Struct, omit_defaults=True, kw_only=True):
    """A result: ``data`` on success, ``error`` otherwise, never both."""

    execution_id: str
    status: Status
    data: Any | UnsetType = UNSET
    error: ErrorBody | None = None
    agent: AgentHints = field(name="_agent")


class EnvelopeError(Struct):
    """The body of a rejected envelope: the error alone, no execution."""

    error: ErrorBody


class ToolSpec(Struct, kw_only=True):
    """One entry of the catalog document (``GET /agent/tools``)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    effect: Effect
    idempotent: bool
    parallel_safe: bool
    confirmation: Confirmation


class CatalogDocument(Struct):
    tools: list[ToolSpec]


class DiscoveryDocument(Struct, kw_only=True, omit_defaults=True):
    protocol: str
    server: str
    capabilities: list[str]
    tools_url: str
    tools_version: str
    execute_url: str
    mcp_url: str
    jobs_url: str | None = None  # with the capability "jobs"
    webhooks: list[str] | None = None  # with the capability "webhooks": the paths deliveries are received at


# --- queue and Redis -------------------------------------------------------------------------


class RetryPolicy(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a job of one tool is tried again after a failure that may pass (docs/protocol.md,
    "Jobs"): at most ``max_attempts`` attempts in all, the n-th retry after
    ``max(backoff · 2^(n-1) capped at max_backoff, the error's retry_after)`` seconds, plus up to
    a tenth more at random, so that jobs that failed together do not come back together."""

    max_attempts: int = 5
    backoff: float = 1.0  # seconds before the first retry
    max_backoff: float = 3600.0  # seconds a backoff never exceeds (retry_after may)


class WorkerTool(Struct, kw_only=True):
    """What a worker publishes about one tool: the public spec and what only the backend needs."""

    spec: ToolSpec
    timeout: float
    title: str | None = None  # MCP's display name; not part of carmy/1's catalog
    retry: RetryPolicy = RetryPolicy()  # for its jobs (absent from a worker of before jobs: the defaults)


class ScheduleSpec(Struct, frozen=True, kw_only=True):
    """A recurring job declared next to the tools (``Toolbox.schedule``): each occurrence of
    ``cron`` (five fields, or six with a leading seconds field), read in ``timezone`` (an IANA
    name), queues one job of ``tool`` with ``arguments`` (canonical JSON). An occurrence missed
    by more than ``grace`` seconds is skipped."""

    name: str
    cron: str
    tool: str
    arguments: bytes = b"{}"
    timezone: str = "UTC"
    grace: float = 60.0


class WorkerInfo(Struct, kw_only=True):
    """Published by each worker at start; the API merges these into the catalog."""

    worker_id: str
    started_ms: int
    tools: list[WorkerTool]
    group: str  # workers with the same tools share an arq queue named after this digest
    host: str = ""
    pid: int = 0
    schedules: list[ScheduleSpec] = []  # the recurring jobs this worker fires (store.jobstore)
    concurrency: int = 0  # executions at once (CARMY_CONCURRENCY); 0: a worker of before, which did not say


class ExecutionJob(Struct, kw_only=True):
    """The payload of one queued execution."""

    execution_id: str
    tool: str
    # Canonical JSON of the arguments (sorted keys, compact): the worker decodes it straight
    # into the tool's input type, and the API fingerprints it.
    arguments: bytes
    request_id: str | None = None
    principal: str | None = None
    session: str | None = None
    permissions: list[str] = []
    metadata: dict[str, Any] = {}
    # The W3C traceparent of the span that submitted it, when tracing is on (carmy_worker.tracing):
    # the worker's spans join that trace.
    traceparent: str | None = None


class Record(Struct, kw_only=True):
    """The one final record of an execution, replayed byte for byte."""

    status_code: int
    body: bytes  # the JSON result body exactly as first sent
    tool: str
    status: Status
    error_code: str | None = None
    retry_after: int | None = None  # sent as the Retry-After header too
    duration_ms: int | None = None


msgpack_encoder = msgspec.msgpack.Encoder()
json_encoder = msgspec.json.Encoder()
canonical_json_encoder = msgspec.json.Encoder(order="sorted")


# --- events ----------------------------------------------------------------------------------
#
# A worker publishes an execution's events as msgpack ``Event``s, to the channel of each API
# process that follows it (``store.lua.EMIT``: prefixed with the execution id there), or on the
# execution's own channel (``store.keys.events``) for one an older API submitted; the API
# relays each as one SSE frame, or MCP progress. Their ``data`` is compact
# JSON, sent on as is.

# The most any event carries through pub/sub. Redis drops a subscriber whose output buffer
# overflows (client-output-buffer-limit pubsub), and an API process reads every execution's
# events on one connection: one huge message would cost every other stream its events.
MAX_EVENT_BYTES = 64 * 1024


class Event(Struct, array_like=True):
    """One message on an execution's pub/sub channel.

    ``data`` is the compact JSON the SSE relay sends as is. For ``final`` it is the stored
    record, or empty when the record is over ``MAX_EVENT_BYTES``: the reader then GETs it.
    """

    name: EventName
    data: bytes


class StartedData(Struct):
    """``tool.started`` (a worker claimed the execution) and the API's ``execution.started``."""

    execution_id: str
    tool: str


class ProgressData(Struct, omit_defaults=True, kw_only=True):
    """``tool.progress``: ``Context.progress`` and ``Context.partial``."""

    execution_id: str
    tool: str
    progress: float | int
    total: float | int | None = None
    message: str | None = None
    partial: Any | UnsetType = UNSET
    trace_id: str | None = None  # the execution's trace, when tracing is on (docs/protocol.md)


class CompletedData(Struct):
    """``tool.completed``: the tool returned (``ok``) or failed; the record follows."""

    execution_id: str
    tool: str
    duration_ms: int
    ok: bool


def started_event(exec_id: str, tool: str) -> bytes:
    return msgpack_encoder.encode(Event("tool.started", json_encoder.encode(StartedData(exec_id, tool))))


def progress_event(data_json: bytes) -> bytes:
    """``data_json``: a ``ProgressData`` already encoded (by the tool's own call, see ``Context``)."""
    return msgpack_encoder.encode(Event("tool.progress", data_json))


def completed_event(exec_id: str, tool: str, duration_ms: int, ok: bool) -> bytes:
    return msgpack_encoder.encode(Event("tool.completed", json_encoder.encode(
        CompletedData(exec_id, tool, duration_ms, ok))))


def final_event(record: Record) -> tuple[bytes, bytes]:
    """The record as stored, and the ``final`` event that announces it: with the record, or
    without it (empty data) when it is over ``MAX_EVENT_BYTES``.

    Only large records take the empty form, so an API that predates it (and would fail to
    decode it) meets it only for those: upgrade APIs before workers.
    """
    stored = msgpack_encoder.encode(record)
    inline = stored if len(stored) <= MAX_EVENT_BYTES else b""
    return stored, msgpack_encoder.encode(Event("final", inline))


# --- SSE frames (text/event-stream) ----------------------------------------------------------


def sse_frame(name: str, data: bytes) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


def sse_started(exec_id: str, tool: str) -> bytes:
    """``execution.started``: the first frame of every stream."""
    return sse_frame("execution.started", json_encoder.encode(StartedData(exec_id, tool)))


def sse_completed(record: Record, *, replayed: bool) -> bytes:
    """``execution.completed``: the result body plus ``replayed``; always the last frame."""
    suffix = b',"replayed":true}' if replayed else b',"replayed":false}'
    return sse_frame("execution.completed", record.body[:-1] + suffix)


SSE_KEEPALIVE = b": keep-alive\n\n"

job_decoder = msgspec.msgpack.Decoder(ExecutionJob)
record_decoder = msgspec.msgpack.Decoder(Record)
event_decoder = msgspec.msgpack.Decoder(Event)
worker_info_decoder = msgspec.msgpack.Decoder(WorkerInfo)
request_decoder = msgspec.json.Decoder(ExecuteRequest)


def is_digits(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits: ``str.isdigit()`` alone also takes "²", which
    ``int()`` refuses, and "١", which it reads (query values, header fields, settings, cursors)."""
    return text.isascii() and text.isdigit()
