"""The records the chaos check keeps: what each attempt of a call got back, each request's
history, each job's creation and reads, each fault and each ledger line, and the audit trail as
Redis held it at the end. msgspec Structs, so ``--out`` and the tests can encode and build them
as they are."""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct

Mode = Literal["json", "sse", "async"]
LedgerEvent = Literal["started", "effect", "abandoned", "failed"]
FaultKind = Literal["worker-kill", "worker-stop", "worker-term", "api-kill", "redis-term", "redis-kill",
                    "redis-failover", "cluster-failover", "cluster-hang", "slot-migrate", "redis-full", "overload",
                    "deploy"]
FAULT_KINDS: tuple[FaultKind, ...] = ("worker-kill", "worker-stop", "worker-term", "api-kill", "redis-term",
                                      "redis-kill", "redis-failover", "cluster-failover", "cluster-hang",
                                      "slot-migrate", "redis-full", "overload", "deploy")
# The Redis a run has: one server, a Sentinel group (--sentinel) or a Redis Cluster (--cluster).
RedisKind = Literal["single", "sentinel", "cluster"]


class Answer(Struct, frozen=True):
    """A final answer, as compared across retries: a replay must give the same four fields
    (the HTTP status is left out, since an SSE stream is always 200)."""

    execution_id: str
    status: str
    code: str | None
    data: str | None  # canonical JSON of ``data``


class Attempt(Struct, kw_only=True):
    """One try of a request: a POST (and, for ``async``, the polls that followed it)."""

    t0: float  # wall clock, as the ledger's
    t1: float
    mode: Mode
    api: str
    http: int | None = None  # None: no HTTP answer (a transport error or a timeout)
    code: str | None = None  # the error code of a refusal or of the answer
    execution_id: str | None = None  # an id the API gave for an accepted execution (202)
    answer: Answer | None = None
    gone: bool = False  # GET of an accepted execution answered 404
    error: str | None = None  # the transport error
    phase: Literal["load", "final"] = "load"


class Request(Struct, kw_only=True):
    """One intended call: one ``request_id``, retried until a final answer or the patience runs out."""

    rid: str
    tool: str
    args: dict[str, int]
    kind: Literal["load", "burst"] = "load"
    first: float  # wall clock of the first attempt
    attempts: list[Attempt] = []


class Stream(Struct, kw_only=True):
    """One SSE call without a request id (``chaos.streams``): the id ``execution.started`` named,
    and how the stream ended."""

    t0: float
    t1: float
    api: str
    http: int | None = None  # None: no HTTP answer
    started: str | None = None  # the execution ``execution.started`` named
    completed: str | None = None  # the one ``execution.completed`` named (None: the stream was cut off)
    status: str | None = None
    code: str | None = None  # the error code of a refusal or of the answer
    answered: bool = False  # the tool's answer (not a refusal)
    error: str | None = None  # the transport error
    attempt: int = 0  # the latest attempt whose progress the stream carried (``named`` reports it)
    stale: int = 0  # progress events of an earlier attempt than one already carried


class Fault(Struct, kw_only=True):
    """One injected fault: when it began, when its target was whole again, and whom it hit."""

    kind: FaultKind
    t: float
    t_end: float
    target: str  # "worker", "api" or "redis", with its pid
    pid: int | None = None
    replacement: int | None = None  # the pid of the process started in its place
    # redis-failover: when the Sentinels named a new primary that takes writes; cluster-failover
    # and cluster-hang: when the primary's replica was promoted and every slot was served again.
    promoted: float | None = None
    woke: float | None = None  # cluster-hang: when the hung primary was woken (some seconds later)
    note: str = ""


class LedgerLine(Struct, kw_only=True):
    """One line of a worker's ledger: a tool started, did its effect, or gave up before it."""

    ev: LedgerEvent
    rid: str
    xid: str  # the execution id
    tool: str
    pid: int
    t: float  # wall clock
    fence: int | None = None  # the fencing attempt, when the tool context exposes one


class Create(Struct, kw_only=True):
    """One ``POST /agent/jobs`` of a job: the job id it was given (202 or 200), or why not."""

    t0: float
    t1: float
    api: str
    http: int | None = None  # None: no HTTP answer
    code: str | None = None  # the error code of a refusal
    job_id: str | None = None
    error: str | None = None  # the transport error
    phase: Literal["load", "final"] = "load"


class JobRead(Struct, kw_only=True):
    """One ``GET /agent/jobs/{job_id}``, as far as the checker compares reads."""

    t: float  # wall clock, when the answer came
    status: str | None  # None: the API answered 404, it does not know the job
    attempts: int = 0
    executions: list[str] = []
    created_ms: int = 0  # unix ms, Redis's clock
    error: str | None = None  # ``last_error``'s code
    result: str | None = None  # canonical JSON of ``result``
    notify: str | None = None  # the callback's ``state``, if the job asked for one (not part of ``state()``)

    def state(self) -> tuple[object, ...]:
        """What must never change once the job has finished."""
        return self.status, self.attempts, tuple(self.executions), self.error, self.result


class Job(Struct, kw_only=True):
    """One intended job: one ``request_id``, posted until it has a job id, then read until the end."""

    rid: str
    tool: str
    args: dict[str, int]
    delay_ms: int | None = None
    run_at: str | None = None  # RFC 3339, as sent
    max_attempts: int
    first: float  # wall clock of the first POST
    notify: str | None = None  # the callback's URL, if the job asks for one
    creates: list[Create] = []
    reads: list[JobRead] = []

    def job_ids(self) -> set[str]:
        return {c.job_id for c in self.creates if c.job_id}


def attempt_of(request_id: str) -> tuple[str, int]:
    """A job attempt's request id split into the job's and the attempt's number: attempt n >= 2
    runs under ``{request_id}#{n}``, the first under the job's own."""
    base, sep, n = request_id.rpartition("#")
    if sep and n.isdigit():
        return base, int(n)
    return request_id, 1


class Delivery(Struct, kw_only=True):
    """One ``POST /agent/webhooks/{name}`` of an event: what the API answered."""

    t0: float
    t1: float
    api: str
    http: int | None = None  # None: no HTTP answer
    code: str | None = None  # the error code of a refusal or of the answer
    execution_id: str | None = None  # mode call: the answer's execution
    job_id: str | None = None  # mode job: the job it created or found
    final: bool = False  # mode call: a final answer (not a refusal worth retrying)
    error: str | None = None  # the transport error
    phase: Literal["load", "final"] = "load"


class Event(Struct, kw_only=True):
    """One event a sender delivers to a webhook, retried and redelivered under its event id; a
    forged one (``forged``: how) is sent once, never signed right."""

    eid: str
    hook: str  # the webhook's name
    mode: Literal["call", "job"]
    body: dict[str, Any]
    forged: str | None = None  # "tampered", "unsigned" or "wrong-secret"
    first: float
    deliveries: list[Delivery] = []


class Callback(Struct, kw_only=True):
    """One delivery the callback receiver got, and what it answered."""

    t: float
    webhook_id: str
    verified: bool  # the standardwebhooks library verified it with CARMY_NOTIFY_SECRET
    job_id: str | None = None
    status: str | None = None  # the job's status in the body
    attempts: int = 0  # the job's attempts in the body
    answered: int = 200


# Every argument object the load sends carries this field (``mark``, which the chaos tools accept
# and ignore): an audit entry that holds the string holds arguments. Nothing else in a run writes
# it, and each run has a Redis of its own.
MARK_FIELD = "mark"
ARGUMENT_MARK = "chaos-argument-marker-9f3c71d2"


def marked(arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` as the load sends them: with the marker the audit trail must never hold."""
    return arguments | {MARK_FIELD: ARGUMENT_MARK}


class RecordSeen(Struct, frozen=True, kw_only=True):
    """An execution's final record as Redis held it at the end: what its audit entries repeat."""

    xid: str
    tool: str
    status: str
    error_code: str | None = None


class RawEntry(Struct, frozen=True, kw_only=True):
    """One entry of the audit stream, every field as Redis holds it (a field the store's decoder
    does not know is kept: it may be where arguments leaked)."""

    id: str  # ``<ms>-<seq>``
    fields: dict[str, str]


class Trail(Struct, kw_only=True):
    """The audit trail and the records, read once the run is over. ``before``: the newest entry
    id when the records began to be read (None: the stream was empty); an entry up to it was
    written, with its record, before they were read. ``added``: entries ever added to the stream
    (``XINFO STREAM``), more than ``entries`` if any were trimmed."""

    records: list[RecordSeen]
    entries: list[RawEntry]
    before: str | None
    added: int
