"""The records the chaos check keeps: what each attempt of a call got back, each request's
history, each fault and each ledger line. msgspec Structs, so ``--out`` and the tests can
encode and build them as they are."""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

Mode = Literal["json", "sse", "async"]
LedgerEvent = Literal["started", "effect", "abandoned"]
FaultKind = Literal["worker-kill", "worker-stop", "worker-term", "api-kill", "redis-term", "redis-kill",
                    "redis-failover", "redis-full", "overload"]
FAULT_KINDS: tuple[FaultKind, ...] = ("worker-kill", "worker-stop", "worker-term", "api-kill", "redis-term",
                                      "redis-kill", "redis-failover", "redis-full", "overload")


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


class Fault(Struct, kw_only=True):
    """One injected fault: when it began, when its target was whole again, and whom it hit."""

    kind: FaultKind
    t: float
    t_end: float
    target: str  # "worker", "api" or "redis", with its pid
    pid: int | None = None
    replacement: int | None = None  # the pid of the process started in its place
    promoted: float | None = None  # redis-failover: when the Sentinels named a new primary that takes writes
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
