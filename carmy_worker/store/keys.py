"""Redis key and channel names, in one place.

Nothing a request sends reaches a key name raw: identities are hashed, and execution ids are
generated here (the API checks the format of any id a client sends back).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading

import msgspec

PREFIX = "carmy:"
PENDING = PREFIX + "pending"  # zset exec_id -> admission deadline (ms): queued or running
QUEUED = PREFIX + "queued"  # zset exec_id -> start-by (ms): accepted and not yet started
WORKERS = PREFIX + "workers"  # zset worker_id -> last heartbeat (ms)
DRAINING = PREFIX + "draining"  # set of workers finishing their work before they stop
WATCH = PREFIX + "watch"  # hash: when Redis was last seen in use, and since when without a gap
CATALOG_CHANNEL = PREFIX + "catalog"  # a worker came or went
CANCEL_CHANNEL = PREFIX + "cancel"  # exec_id of an execution to cancel, for every worker
# The operator console's signing secret when CARMY_CONSOLE_SECRET is unset: the first API
# replica to need one writes it, and every replica signs and checks sessions with it.
CONSOLE_SECRET = PREFIX + "console:secret"
# Stream of audit entries, one per finished execution (and per replay), oldest first (store/audit.py)
AUDIT = PREFIX + "audit"

_JOB_ID = re.compile(r"job_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
_EXECUTION_ID = re.compile(r"exec_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def new_execution_id() -> str:
    """``exec_`` and a random (version 4) UUID, as ``uuid.uuid4()`` writes one: its 122 random
    bits from the system's CSPRNG, read 4 KiB at a time rather than with a system call per id."""
    return "exec_" + _uuid4()


def new_job_id() -> str:
    """``job_`` and a random (version 4) UUID, as for an execution."""
    return "job_" + _uuid4()


def _uuid4() -> str:
    b = bytearray(_random_bytes(16))
    b[6] = (b[6] & 0x0F) | 0x40  # version 4
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class _Randomness:
    """``os.urandom``, drawn from a block read ahead; a forked child reads a block of its own
    (it must not hand out the ids its parent does)."""

    BLOCK = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._block = b""
        self._at = 0

    def take(self, n: int) -> bytes:
        with self._lock:
            if self._at + n > len(self._block):
                self._block, self._at = os.urandom(self.BLOCK), 0
            taken = self._block[self._at:self._at + n]
            self._at += n
            return taken

    def forget(self) -> None:
        self._block, self._at = b"", 0


_randomness = _Randomness()
_random_bytes = _randomness.take
os.register_at_fork(after_in_child=_randomness.forget)


def is_execution_id(value: str) -> bool:
    return _EXECUTION_ID.fullmatch(value) is not None


def is_job_id(value: str) -> bool:
    return _JOB_ID.fullmatch(value) is not None


def execution(exec_id: str) -> str:
    """Hash of an execution's live state: tool, owner, attempt, state, worker, cancel, and when
    (Redis's clock, ms) it was accepted (``queued_at``), last claimed (``started_at``) and ended
    (``ended_at``); while it runs, its newest progress ``message`` and when it came (``message_at``);
    where its events go (``reply``, ``joined``, ``stream``: ``lua.EMIT``)."""
    return f"{PREFIX}exe:{exec_id}"


RECORD_PREFIX = PREFIX + "rec:"


def record(exec_id: str) -> str:
    """The final record, written once."""
    return RECORD_PREFIX + exec_id


def events(exec_id: str) -> str:
    """The pub/sub channel of one execution's events."""
    return f"{PREFIX}ev:{exec_id}"


def api_channel(process_id: str) -> str:
    """The pub/sub channel of one API process: the events of every execution it follows, each
    message the execution id, a space, and the event (``lua.EMIT``)."""
    return f"{PREFIX}api:{process_id}"


def worker(worker_id: str) -> str:
    return f"{PREFIX}worker:{worker_id}"


def running(worker_id: str) -> str:
    """Set of executions a worker has claimed and not settled."""
    return f"{PREFIX}running:{worker_id}"


def leases(worker_id: str) -> str:
    """Hash of the jobs a worker has leased (job id -> lease token), claimed or not yet."""
    return f"{PREFIX}leases:{worker_id}"


def lock(tool: str) -> str:
    return f"{PREFIX}lock:{tool}"


def _digest(*parts: str | None) -> str:
    return hashlib.sha256(msgspec.msgpack.encode(parts)).hexdigest()


def idempotency(principal: str | None, session: str | None, request_id: str) -> str:
    """The key of an idempotency record: a hash of (principal, session, request_id)."""
    return f"{PREFIX}idem:{_digest(principal, session, request_id)}"


@functools.lru_cache(maxsize=4096)  # a principal calls again and again: one digest, not one a call
def owner(principal: str | None) -> str:
    """How an execution records who may see it, without storing the principal itself."""
    return _digest(principal)[:32]


def quota_pending(owner: str) -> str:
    """Zset of one principal's pending executions (exec_id -> admission deadline, ms), by its
    ``owner`` hash: the part of ``PENDING`` its quota counts (store/quota.py)."""
    return f"{PREFIX}quota:pending:{owner}"


def quota_bucket(owner: str) -> str:
    """One principal's token bucket, by its ``owner`` hash: the µs instant it is full again."""
    return f"{PREFIX}quota:bucket:{owner}"


def fingerprint(tool: str, canonical_arguments: bytes) -> str:
    """Same tool and same arguments (canonical JSON) give the same fingerprint."""
    return hashlib.sha256(tool.encode() + b"\0" + canonical_arguments).hexdigest()


def mcp_call(principal: str | None, session: str | None, mcp_session: str, request_id: str) -> str:
    """Which execution an MCP ``tools/call`` started, so that its ``notifications/cancelled``
    (which may reach another API replica) can find it: (caller, MCP session, JSON-RPC id), hashed."""
    return f"{PREFIX}mcpcall:{_digest(principal, session, mcp_session, request_id)}"


# --- jobs (store/jobstore.py) ----------------------------------------------------------------

JOBS_SETTLED = PREFIX + "jobs:settled"  # zset exec_id -> ms: an execution of a job has its record
JOBS_RUNNING = PREFIX + "jobs:running"  # zset exec_id -> ms: executions of jobs, from promotion to conclusion
JOBS_ALL = PREFIX + "jobs:all"  # zset job_id -> created (µs): every job, for an operator's list
JOBS_DEAD = PREFIX + "jobs:dead"  # zset job_id -> dead-lettered (ms)
JOBS_EXPIRING = PREFIX + "jobs:expiring"  # zset "job_id owner" -> when its retention ends (ms)
JOB_PREFIX = PREFIX + "job:"
# zset job_id -> when its callback's next delivery attempt is due (ms; store/callbacks.py)
CALLBACKS_DUE = PREFIX + "callbacks:due"


def job(job_id: str) -> str:
    """Hash of one job: what it runs, for whom, its status, attempts and outcome (store.jobstore)."""
    return JOB_PREFIX + job_id


def job_due(tool: str) -> str:
    """Zset of a tool's queued jobs (job_id -> when it is due, ms): what the workers serving the
    tool promote to executions once due."""
    return f"{PREFIX}jobs:due:{tool}"


def jobs_of(owner: str) -> str:
    """Zset of one principal's jobs (job_id -> created, µs), by its ``owner`` hash: its list."""
    return f"{PREFIX}jobs:by:{owner}"


def jobs_open(owner: str) -> str:
    """Zset of one principal's unfinished jobs (job_id -> created, µs): its limit counts them."""
    return f"{PREFIX}jobs:open:{owner}"


def job_idempotency(principal: str | None, session: str | None, request_id: str) -> str:
    """Which job a request id created: a hash of (principal, session, request_id), apart from
    the executions' (the same id may name a call and a job)."""
    return f"{PREFIX}jobidem:{_digest(principal, session, request_id)}"


# Who a schedule's jobs belong to: no principal's ``owner`` (a 32-hex digest) can be this, so no
# caller (the anonymous one of an API without keys included) sees or cancels them; an operator does.
SCHEDULES_OWNER = "schedules"


def schedule_idempotency(request_id: str) -> str:
    """Which job one occurrence of a schedule queued (its request id names the schedule and the
    occurrence), apart from every caller's job request ids: no caller can take an occurrence's."""
    return f"{PREFIX}jobidem:schedule:{_digest(request_id)}"


def schedule(name: str) -> str:
    """Hash of one recurring schedule's state: the occurrence it waits for, its last job, and
    how many occurrences it skipped."""
    return f"{PREFIX}schedule:{name}"
