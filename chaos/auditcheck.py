"""The reconciliation of the audit trail: the entries of ``carmy:audit`` against the final
records (``carmy:rec:*``), both read from Redis once the faults have stopped and every call and
job has finished (``chaos.auditread``), and against what callers were answered and the ledger
saw. Pure functions, as ``chaos.jobcheck`` is.

The promise (store/audit.py): no execution finishes without its entry, none has two, and an
entry never holds arguments. A record is what "finished" means: whatever writes one (SETTLE, and
``impose`` for cancels, reaps and expiries) appends the entry in the same script. A retry
answered with a finished execution's record appends an entry of its own, ``replayed``.

Definitions (each a violation):

* **finished without an entry**: a record with no entry (other than replays) of its execution.
  An execution a caller was told had finished is one of these if its record is there and its
  entry is not (the row says how many were answered); if its record is gone too, the calls' rows
  count it (lost, flipped).
* **audited twice**: two entries, neither a replay, of one execution.
* **unlike their records**: an entry (a replay's too) whose tool, status or error code is not its
  record's; whose request id is not the one the ledger's runs of that execution, or its caller,
  had; whose job is not the one whose reads list the execution; or with no record at all, if it
  was written before the records were read (``Trail.before``: a later one's record may not have
  been seen). Records are kept a day and the entries' trim is set far above the run's count, so
  neither expires nor is trimmed during a run (the info row says how many were trimmed: if any,
  the first row cannot be trusted).
* **replays not audited**: fewer replayed entries of an execution, by a door, than the answers
  known to be its replays by that door. Known are only the answers after the faults stopped (the
  final retry of every request, the last delivery of every webhook event): the same answer as
  an earlier one, asked for after that one had come, so the record existed when it was asked
  for and ``calls.start`` answered from it. Earlier, a replay is not told apart from a retry
  that joined the running execution (``replayed`` in SSE means either), and the API gives up a
  replay's entry on a Redis error rather than the answer: those are counted only as info.
* **arguments in the trail**: an entry, any of its fields or values, holding the marker every
  argument object of the load carries (``chaos.model.ARGUMENT_MARK``).

Redis's loss window excuses none of these: a record and its entry are written by one script,
and Redis keeps a script's writes together in its AOF and its replication stream (one MULTI/EXEC;
a cut-off one is dropped whole at load), so a crash or a failover loses both or neither. The
info row of the loss window counts, of the executions the rows name, those that finished or ran
in the second before a Redis ``kill -9`` or failover, as the other tables do.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from msgspec import Struct

from carmy_worker.store.audit import decode, stream_id
from carmy_worker.wire import AuditEntry
from chaos.facts import Facts
from chaos.model import ARGUMENT_MARK, Event, Job, LedgerLine, RawEntry, RecordSeen, Request, Trail


class AuditTable(Struct, kw_only=True):
    """The audit trail's findings. Lists hold execution ids (entry ids for the arguments' row)."""

    entries: int
    replayed: int  # of them, replays
    by_via: dict[str, int]  # the entries (replays too) by the door they name ("-": none)
    records: int
    trimmed: int  # entries added to the stream and no longer in it
    unaudited: list[str]
    unaudited_answered: int  # of them, executions a caller was answered with
    twice: list[str]
    unlike: list[str]
    known_replays: int  # answers after the faults that were replays
    unaudited_replays: list[str]
    with_arguments: list[str]
    in_loss_window: list[str]  # of the executions the rows name

    def violations(self) -> dict[str, int]:
        found = {"executions finished without an audit entry": len(self.unaudited),
                 "executions audited twice": len(self.twice), "audit entries unlike their records": len(self.unlike),
                 "replays not audited": len(self.unaudited_replays),
                 "arguments in the audit trail": len(self.with_arguments)}
        return {name: n for name, n in found.items() if n}

    def named(self) -> set[str]:
        """The execution ids the rows name."""
        return {xid for xids in (self.unaudited, self.twice, self.unlike, self.unaudited_replays) for xid in xids}


class Origin(Struct, frozen=True):
    """Who asked for an execution, as the load and the ledger know it."""

    rid: str
    job_id: str | None = None


def _decoded(raw: RawEntry) -> AuditEntry:
    """An entry read by ``chaos.auditread`` (its id in the trail) as the wire shows it."""
    partition, in_stream = stream_id(raw.id)
    return decode(in_stream, raw.fields, partition)


def id_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id (``<ms>-<seq>``) in its order."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def holds_arguments(entry: RawEntry, mark: str = ARGUMENT_MARK) -> bool:
    """Whether any field of the entry, its name or its value, holds the load's marker."""
    return any(mark in name or mark in value for name, value in entry.fields.items())


def door(mode: str) -> str:
    """The ``via`` the API writes for a call made this way (a respond-async POST is plain HTTP)."""
    return "sse" if mode == "sse" else "http"


def request_replays(request: Request) -> Iterable[tuple[str, str]]:
    """(execution id, door) of each of the request's final-phase answers that replayed an
    earlier answer: the same answer, asked for after that one had come."""
    given = [(a.t1, a.answer) for a in request.attempts if a.answer is not None]
    for a in request.attempts:
        if a.phase == "final" and a.answer is not None and any(t <= a.t0 and earlier == a.answer
                                                               for t, earlier in given):
            yield a.answer.execution_id, door(a.mode)


def event_replays(event: Event) -> Iterable[tuple[str, str]]:
    """As ``request_replays``, for a true event's last deliveries (mode ``call``)."""
    given = [(d.t1, d.execution_id, d.http, d.code) for d in event.deliveries if d.final and d.execution_id]
    for d in event.deliveries:
        if d.phase == "final" and d.final and d.execution_id and any(
                t <= d.t0 and (xid, http, code) == (d.execution_id, d.http, d.code) for t, xid, http, code in given):
            yield d.execution_id, "webhook"


def known_replays(requests: list[Request], events: list[Event]) -> Counter[tuple[str, str]]:
    """How many answers after the faults replayed each execution, by door."""
    found: Counter[tuple[str, str]] = Counter()
    for request in requests:
        found.update(request_replays(request))
    for event in events:
        if event.forged is None and event.mode == "call":
            found.update(event_replays(event))
    return found


def answered(requests: list[Request], events: list[Event]) -> dict[str, list[float]]:
    """When callers were answered with each execution (final answers and webhook results)."""
    found: dict[str, list[float]] = defaultdict(list)
    for request in requests:
        for a in request.attempts:
            if a.answer is not None:
                found[a.answer.execution_id].append(a.t1)
    for event in events:
        for d in event.deliveries:
            if d.final and d.execution_id:
                found[d.execution_id].append(d.t1)
    return found


def origins(requests: list[Request], events: list[Event], jobs: list[Job],
            ledger: list[LedgerLine]) -> dict[str, Origin]:
    """The request id (and job) each execution was for: its runs' lines, its caller's answers."""
    rids = {line.xid: line.rid for line in ledger}
    for request in requests:
        rids.update({a.answer.execution_id: request.rid for a in request.attempts if a.answer is not None})
    for event in events:
        if event.forged is None:
            rids.update({d.execution_id: event.eid for d in event.deliveries if d.final and d.execution_id})
    job_of = {xid: next(iter(job.job_ids())) for job in jobs if len(job.job_ids()) == 1
              for read in job.reads for xid in read.executions}
    return {xid: Origin(rid, job_of.get(xid)) for xid, rid in rids.items()}


def unlike(entry: AuditEntry, record: RecordSeen | None, origin: Origin | None) -> bool:
    """Whether an entry says other than its record and its caller (None: no record)."""
    if record is None:
        return True
    if (entry.tool, entry.status, entry.error_code) != (record.tool, record.status, record.error_code):
        return True
    return origin is not None and (entry.request_id != origin.rid
                                   or (origin.job_id is not None and entry.job_id != origin.job_id))


def loss_window(named: set[str], entries: list[AuditEntry], raw: list[RawEntry], told: dict[str, list[float]],
                ledger: list[LedgerLine], facts: Facts) -> list[str]:
    """Of ``named``, the executions that finished (an entry's time), ran or were answered in the
    second before a Redis crash."""
    moments: dict[str, list[float]] = defaultdict(list)
    for entry, fields in zip(entries, raw, strict=True):
        finished = fields.fields.get("finished_at", "")
        if finished.isdigit():
            moments[entry.execution_id].append(int(finished) / 1000)
    for line in ledger:
        moments[line.xid].append(line.t)
    for xid, times in told.items():
        moments[xid] += times
    return sorted(xid for xid in named if any(facts.in_loss_window(t, t) for t in moments.get(xid, [])))


def reconcile_audit(trail: Trail, requests: list[Request], events: list[Event], jobs: list[Job],
                    ledger: list[LedgerLine], facts: Facts) -> AuditTable:
    """The rows, from the trail and records read at the end and what the run saw."""
    entries = [_decoded(raw) for raw in trail.entries]
    records = {record.xid: record for record in trail.records}
    own: dict[str, list[AuditEntry]] = defaultdict(list)
    replays: Counter[tuple[str, str]] = Counter()
    for entry in entries:
        if entry.replayed:
            replays[(entry.execution_id, entry.via or "")] += 1
        else:
            own[entry.execution_id].append(entry)
    before = id_key(trail.before) if trail.before else None
    asked, told = origins(requests, events, jobs, ledger), answered(requests, events)
    known = known_replays(requests, events)
    unaudited = sorted(xid for xid in records if not own.get(xid))
    table = AuditTable(
        entries=len(entries), replayed=sum(replays.values()),
        by_via=dict(sorted(Counter(entry.via or "-" for entry in entries).items())),
        records=len(records), trimmed=max(0, trail.added - len(entries)),
        unaudited=unaudited, unaudited_answered=sum(xid in told for xid in unaudited),
        twice=sorted(xid for xid, found in own.items() if len(found) > 1),
        unlike=sorted({entry.execution_id for entry in entries
                       if (entry.execution_id in records or (before is not None and id_key(entry.id) <= before))
                       and unlike(entry, records.get(entry.execution_id), asked.get(entry.execution_id))}),
        known_replays=sum(known.values()),
        unaudited_replays=sorted({xid for (xid, via), n in known.items() if replays[(xid, via)] < n}),
        with_arguments=[raw.id for raw in trail.entries if holds_arguments(raw)],
        in_loss_window=[])
    table.in_loss_window = loss_window(table.named(), entries, trail.entries, told, ledger, facts)
    return table
