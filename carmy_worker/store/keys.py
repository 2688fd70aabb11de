"""Redis key and channel names, in one place, and the partitions they are spread over.

Nothing a request sends reaches a key name raw: identities are hashed, and execution ids are
generated here (the API checks the format of any id a client sends back).

**Partitions** (docs/architecture.md, section 3). Every key a script touches carries a Redis
Cluster hash tag, ``{c:N}`` for partition N, so that each script's keys are in one slot. An
execution's partition is a stable function of its id alone (``partition_of``: its last 16 bits,
which are random, modulo the count), so any process finds it from the id; a request's
idempotency key is placed by the hash of (principal, session, request id), and the API draws the
new execution's id into that same partition (``new_execution_id(partition)``), so that SUBMIT
finds a replay in one script; a principal with a quota has all its calls in its home partition
instead (``home_partition``), where its quota's keys are. The count is ``CARMY_REDIS_PARTITIONS``, set once per process
(``use_partitions``) before any key is named, and recorded in Redis (``PARTITIONS``: its own
slot) so that processes configured with another count refuse to start (``store.partitions``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading

import msgspec

PREFIX = "carmy:"
# The partition count every process must agree on, written by the first one (store.partitions).
PARTITIONS = PREFIX + "{meta}:partitions"


class _Layout:
    """The process's partition count and each partition's key prefix, ``carmy:{c:N}:``."""

    __slots__ = ("count", "prefixes")

    def __init__(self, count: int) -> None:
        self.count = count
        self.prefixes = tuple(f"{PREFIX}{{c:{n}}}:" for n in range(count))


_layout = _Layout(1)


def use_partitions(count: int) -> None:
    """Name every key of this process over ``count`` partitions (at start, before any key is
    named: store.partitions checks it against the count recorded in Redis)."""
    global _layout
    if count < 1:
        raise ValueError("at least one partition")
    _layout = _Layout(count)


def partition_count() -> int:
    return _layout.count


def partition_prefix(partition: int) -> str:
    """``carmy:{c:N}:``, the prefix of every key of partition N (one hash slot)."""
    return _layout.prefixes[partition]


def partition_of(identifier: str) -> int:
    """The partition of an execution or a job, from its id alone: the UUID's last 16 bits
    (random) modulo the count. An empty id (a prefix asked for) is partition 0."""
    count = _layout.count
    if count == 1 or not identifier:
        return 0
    return int(identifier[-4:], 16) % count


def _prefix_of(identifier: str) -> str:
    return _layout.prefixes[partition_of(identifier)]


def partition_of_key(name: str) -> int:
    """The partition of a key named in one (its ``{c:N}`` tag)."""
    start = name.index("{c:") + 3
    return int(name[start:name.index("}", start)])


def partition_of_digest(digest: str) -> int:
    """The partition of a key named by a SHA-256 hex digest (idempotency): its first 32 bits."""
    count = _layout.count
    return 0 if count == 1 else int(digest[:8], 16) % count


def partitions() -> range:
    return range(_layout.count)


def pending(partition: int) -> str:
    """Zset of ``partition``'s admitted executions (exec_id -> admission deadline, ms): queued or
    running. SUBMIT admits up to its share of ``CARMY_MAX_PENDING`` (``share``)."""
    return _layout.prefixes[partition] + "pending"


def queued(partition: int) -> str:
    """Zset of ``partition``'s accepted executions not yet started (exec_id -> start-by, ms)."""
    return _layout.prefixes[partition] + "queued"


def share(total: int) -> int:
    """A partition's part of a limit over every partition: ``ceil(total / count)``, so that the
    partitions together never admit more than ``total + count - 1``."""
    return -(-total // _layout.count)


# The roster, one copy per partition (docs/architecture.md, section 3): a worker heartbeats in
# every partition, so each partition's janitor judges, and reaps, that partition's work alone.
def workers(partition: int) -> str:
    """Zset of the workers heartbeating in ``partition``: worker_id -> last heartbeat (ms)."""
    return _layout.prefixes[partition] + "workers"


def draining(partition: int) -> str:
    """Set of the workers finishing their work before they stop, as ``partition`` knows them."""
    return _layout.prefixes[partition] + "draining"


def groups(partition: int) -> str:
    """Zset of the worker groups whose queues ``partition`` may hold: group -> when a worker of it
    last beat there (ms); for a gone group whose queue still holds what could run, a mark that has
    the janitor look at it again a minute on (``store.groups``)."""
    return _layout.prefixes[partition] + "groups"


def watch(partition: int) -> str:
    """Hash: when ``partition``'s slot was last seen in use, and since when without a gap."""
    return _layout.prefixes[partition] + "watch"


CATALOG_CHANNEL = PREFIX + "catalog"  # a worker came or went (classic pub/sub: rare messages)
# The operator console's signing secret when CARMY_CONSOLE_SECRET is unset: the first API
# replica to need one writes it, and every replica signs and checks sessions with it.
CONSOLE_SECRET = PREFIX + "console:secret"


def audit(partition: int) -> str:
    """Stream of ``partition``'s audit entries, one per finished execution of it (and per
    replay), oldest first (store/audit.py): the trail is every partition's, merged."""
    return _layout.prefixes[partition] + "audit"


_JOB_ID = re.compile(r"job_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
_EXECUTION_ID = re.compile(r"exec_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def new_execution_id(partition: int | None = None) -> str:
    """``exec_`` and a random (version 4) UUID, as ``uuid.uuid4()`` writes one: its 122 random
    bits from the system's CSPRNG, read 4 KiB at a time rather than with a system call per id.
    With ``partition``, ids are drawn until one lands in it (``partition_of``): still a random
    UUID4, and one draw in ``count`` on average lands."""
    return "exec_" + _uuid4_in(partition)


def new_job_id(partition: int | None = None) -> str:
    """``job_`` and a random (version 4) UUID, as for an execution."""
    return "job_" + _uuid4_in(partition)


def _uuid4_in(partition: int | None) -> str:
    count = _layout.count
    while True:
        uuid = _uuid4()
        if partition is None or count == 1 or int(uuid[-4:], 16) % count == partition:
            return uuid


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


EXECUTION = "exe:"  # what follows a partition's prefix in an execution's hash name
LOST = "lost:"  # and in a worker's set of losses (``lost``)


def execution(exec_id: str) -> str:
    """Hash of an execution's live state: tool, owner, attempt, state, worker, cancel, and when
    (Redis's clock, ms) it was accepted (``queued_at``), last claimed (``started_at``) and ended
    (``ended_at``); while it runs, its newest progress ``message`` and when it came (``message_at``);
    where its events go (``reply``, ``joined``, ``stream``: ``lua.EMIT``)."""
    return f"{_prefix_of(exec_id)}{EXECUTION}{exec_id}"


def record_prefix(partition: int) -> str:
    """What a record's key is named by in ``partition``: the prefix, then the execution id."""
    return _layout.prefixes[partition] + "rec:"


def execution_prefix(partition: int) -> str:
    """What an execution's hash is named by in ``partition``: the prefix, then its id."""
    return _layout.prefixes[partition] + EXECUTION


def record(exec_id: str) -> str:
    """The final record, written once."""
    return f"{_prefix_of(exec_id)}rec:{exec_id}"


def staged_record(exec_id: str) -> str:
    """Where a worker writes a large record just ahead of its SETTLE, which renames it to
    ``record`` (or drops it): ``store.staging``."""
    return f"{_prefix_of(exec_id)}staged-rec:{exec_id}"


def events(exec_id: str) -> str:
    """The pub/sub channel of one execution's events."""
    return f"{PREFIX}ev:{exec_id}"


def api_channel(process_id: str, partition: int) -> str:
    """The sharded channel (``SPUBLISH``, in the partition's slot) of one API process for the
    executions of ``partition``: the events of every one it follows, each message the execution
    id, a space, and the event (``lua.EMIT``). A process subscribes to every partition's."""
    return f"{_layout.prefixes[partition]}api:{process_id}"


def cancel_channel(partition: int) -> str:
    """The sharded channel of the cancellations of ``partition``'s executions (their ids), which
    every worker subscribes to, for every partition."""
    return f"{_layout.prefixes[partition]}cancel"


def worker(worker_id: str) -> str:
    """A worker's ``WorkerInfo`` (msgpack): partition 0's alone, where the catalog reads it."""
    return f"{_layout.prefixes[0]}worker:{worker_id}"


def running(worker_id: str, partition: int) -> str:
    """Set of ``partition``'s executions a worker has claimed and not settled."""
    return f"{_layout.prefixes[partition]}running:{worker_id}"


def leases(worker_id: str, partition: int) -> str:
    """Hash of ``partition``'s jobs a worker has leased (job id -> lease token), claimed or not yet."""
    return f"{_layout.prefixes[partition]}leases:{worker_id}"


def lost(worker_id: str, partition: int) -> str:
    """Set of ``partition``'s executions a worker lost while it ran them (REAP, or another
    worker's claim, put it there in the same script): what its next heartbeat checks when no
    write can have been lost since its last full one (``store.roster``). Drained by each beat;
    an hour's TTL from its last addition, for a worker that never comes back."""
    return f"{_layout.prefixes[partition]}{LOST}{worker_id}"


def beat_named(worker_id: str, partition: int) -> str:
    """Set of the executions a worker named in a heartbeat sent in parts (``store.roster``),
    for its scan parts to find the strays against; gone once its last part ran (60 s at most)."""
    return f"{_layout.prefixes[partition]}beat:{worker_id}:named"


def beat_has(worker_id: str, partition: int) -> str:
    """Set of the jobs a worker said it has in a heartbeat sent in parts, for its scan parts to
    find the orphaned leases against; gone once its last part ran (60 s at most)."""
    return f"{_layout.prefixes[partition]}beat:{worker_id}:has"


def beat_scan(worker_id: str, partition: int) -> str:
    """Hash of where a heartbeat sent in parts has got to in its scans of the worker's running
    set and leases (``strays``, ``orphans``: a cursor, or ``done``); gone once its last part ran
    (60 s at most)."""
    return f"{_layout.prefixes[partition]}beat:{worker_id}:scan"


def lock(tool: str) -> str:
    """A ``parallel_safe=False`` tool's lock: in a slot of its own (``{lock:<tool>}``), which no
    partition's execution shares, so that taking it is a script of its own (store/locks.py)."""
    return f"{PREFIX}{{lock:{tool}}}"


def _digest(*parts: str | None) -> str:
    return hashlib.sha256(msgspec.msgpack.encode(parts)).hexdigest()


def idempotency(principal: str | None, session: str | None, request_id: str, partition: int | None = None) -> str:
    """The key of an idempotency record: a hash of (principal, session, request_id), in
    ``partition``, the one its execution was drawn into (``request_partition``); None: its
    digest's (as for a principal without a quota)."""
    digest = _digest(principal, session, request_id)
    return f"{_layout.prefixes[partition_of_digest(digest) if partition is None else partition]}idem:{digest}"


def request_partition(principal: str | None, session: str | None, request_id: str | None, *,
                      homed: bool = False) -> int | None:
    """The partition of a call's idempotency key (None without a request id: any partition),
    which is where SUBMIT must create its execution (``new_execution_id``). ``homed``: the
    principal has a quota, so every call of it, with a request id or not, goes to its home
    partition (``home_partition``), where its quota's keys are."""
    if homed:
        return home_partition(owner(principal))
    if request_id is None or _layout.count == 1:
        return None if request_id is None else 0
    return partition_of_digest(_digest(principal, session, request_id))


@functools.lru_cache(maxsize=4096)  # a principal calls again and again: one digest, not one a call
def owner(principal: str | None) -> str:
    """How an execution records who may see it, without storing the principal itself."""
    return _digest(principal)[:32]


def home_partition(owner: str) -> int:
    """A principal's home partition, by its ``owner`` hash (its first 32 bits modulo the count):
    where everything kept per principal is (its quota's keys, so every execution and every job
    of a principal with a quota, with the job limit and request ids of those jobs)."""
    return int(owner[:8], 16) % _layout.count


def quota_pending(owner: str, partition: int) -> str:
    """Zset of one principal's pending executions (exec_id -> admission deadline, ms), by its
    ``owner`` hash: the part of ``pending`` its quota counts (store/quota.py). Only its home
    partition's is ever written (``home_partition``)."""
    return f"{_layout.prefixes[partition]}quota:pending:{owner}"


def quota_bucket(owner: str, partition: int) -> str:
    """One principal's token bucket, by its ``owner`` hash: the µs instant it is full again.
    Only its home partition's is ever written (``home_partition``)."""
    return f"{_layout.prefixes[partition]}quota:bucket:{owner}"


def fingerprint(tool: str, canonical_arguments: bytes) -> str:
    """Same tool and same arguments (canonical JSON) give the same fingerprint."""
    return hashlib.sha256(tool.encode() + b"\0" + canonical_arguments).hexdigest()


def mcp_call(principal: str | None, session: str | None, mcp_session: str, request_id: str) -> str:
    """Which execution an MCP ``tools/call`` started, so that its ``notifications/cancelled``
    (which may reach another API replica) can find it: (caller, MCP session, JSON-RPC id), hashed."""
    return f"{PREFIX}mcpcall:{_digest(principal, session, mcp_session, request_id)}"


# --- jobs (store/jobstore.py) ----------------------------------------------------------------
# Every job index is per partition, and a job's keys are in its id's partition. A principal with
# a quota has all its jobs drawn into its home partition (``home_partition``), so that CREATE
# counts its unfinished jobs exactly and charges its rate in one script; any other principal's
# jobs spread as its calls do (a job request id's key placed by its digest, the job drawn there;
# without one, any partition), each partition counting its ``share`` of the limit. A schedule's
# jobs are drawn into its own partition (``schedule_partition``). Lists merge every partition's.


def jobs_settled(partition: int) -> str:
    """Zset exec_id -> ms: an execution of a job of ``partition`` has its record (SETTLE, impose)."""
    return _layout.prefixes[partition] + "jobs:settled"


def jobs_running(partition: int) -> str:
    """Zset "exec_id job_id" -> ms: executions of ``partition``'s jobs, from promotion to conclusion."""
    return _layout.prefixes[partition] + "jobs:running"


def jobs_all(partition: int) -> str:
    """Zset job_id -> created (µs): every job of ``partition``, for an operator's list."""
    return _layout.prefixes[partition] + "jobs:all"


def jobs_dead(partition: int) -> str:
    """Zset job_id -> dead-lettered (ms): ``partition``'s dead letters."""
    return _layout.prefixes[partition] + "jobs:dead"


def jobs_expiring(partition: int) -> str:
    """Zset "job_id owner" -> when its retention ends (ms), of ``partition``'s finished jobs."""
    return _layout.prefixes[partition] + "jobs:expiring"


def callbacks_due(partition: int) -> str:
    """Zset job_id -> when its callback's next delivery attempt is due (ms; store/callbacks.py)."""
    return _layout.prefixes[partition] + "callbacks:due"


def job(job_id: str) -> str:
    """Hash of one job: what it runs, for whom, its status, attempts and outcome (store.jobstore)."""
    return f"{_prefix_of(job_id)}job:{job_id}"


def job_due(tool: str, partition: int) -> str:
    """Zset of a tool's queued jobs of ``partition`` (job_id -> when it is due, ms): what the
    workers serving the tool promote to executions once due."""
    return f"{_layout.prefixes[partition]}jobs:due:{tool}"


def jobs_looked(loop_id: str, partition: int) -> str:
    """String of what one job loop's last LOOK in ``partition`` leased to it: that LOOK's number,
    then ``tool-index job_id lease-end`` for each due job, while the newest of those leases lasts
    (a LOOK whose reply the loop never read hands them to it again: store.promotion)."""
    return f"{_layout.prefixes[partition]}jobs:looked:{loop_id}"


def jobs_of(owner: str, partition: int) -> str:
    """Zset of one principal's jobs of ``partition`` (job_id -> created, µs), by its ``owner``
    hash: its list is every partition's, merged (a schedule's jobs, owned by ``SCHEDULES_OWNER``,
    are in the schedule's partition)."""
    return f"{_layout.prefixes[partition]}jobs:by:{owner}"


def jobs_open(owner: str, partition: int) -> str:
    """Zset of one principal's unfinished jobs of ``partition`` (job_id -> created, µs): its limit
    counts them there (all of them, in its home partition, for a principal with a quota)."""
    return f"{_layout.prefixes[partition]}jobs:open:{owner}"


def job_idempotency(principal: str | None, session: str | None, request_id: str, *, homed: bool = False) -> str:
    """Which job a request id created: a hash of (principal, session, request_id), apart from
    the executions' (the same id may name a call and a job), where its job is drawn (``job_id``
    in ``partition_of_key`` of this key): by the digest, so that a principal's jobs spread; in
    the principal's home partition if ``homed`` (it has a quota: its limit is counted there)."""
    digest = _digest(principal, session, request_id)
    partition = home_partition(owner(principal)) if homed else partition_of_digest(digest)
    return f"{_layout.prefixes[partition]}jobidem:{digest}"


# Who a schedule's jobs belong to: no principal's ``owner`` (a 32-hex digest) can be this, so no
# caller (the anonymous one of an API without keys included) sees or cancels them; an operator does.
SCHEDULES_OWNER = "schedules"


def schedule_partition(name: str) -> int:
    """The partition of a schedule's state and of the jobs its occurrences queue: by a hash of
    its name, so that FIRE is one script in one slot."""
    count = _layout.count
    return 0 if count == 1 else int(_digest(name)[:8], 16) % count


def schedule_idempotency(name: str, request_id: str) -> str:
    """Which job one occurrence of schedule ``name`` queued (its request id names the schedule and
    the occurrence), apart from every caller's job request ids: no caller can take an occurrence's."""
    return f"{_layout.prefixes[schedule_partition(name)]}jobidem:schedule:{_digest(request_id)}"


def schedule(name: str) -> str:
    """Hash of one recurring schedule's state: the occurrence it waits for, its last job, and
    how many occurrences it fired and skipped. It expires its grace and the worker's
    CARMY_JOBS_RETENTION past that occurrence (each fire sets it again: store.promotion)."""
    return f"{_layout.prefixes[schedule_partition(name)]}schedule:{name}"
