"""What the store holds for the schedule's occurrences the check found missed: read at the end,
once the jobs have finished, so that a missed second names its cause rather than only its time.

An occurrence leaves a trail in the schedule's partition (``store.promotion.FIRE``): its
idempotency key names the job FIRE queued for it, the job's hash lists the executions its
attempts were promoted to (PROMOTE), and each execution has its hash (who claimed which
attempt, whether its tool ``began``, whether the janitor ``reaped`` it) and, once settled, its
record. Where the trail stops says where the occurrence was lost: no key (never fired, or the
write was lost), a job never promoted, an execution never claimed, or one settled without its
tool starting (``EXECUTION_UNCERTAIN`` for a non-idempotent tool dead-letters its job). A job
never promoted is looked up in its tool's due set too: a score past its ``due`` is a LOOK's
lease (``store.promotion.DUE_LEASE_MS``) that no PROMOTE followed; no score, that it left it.

The schedule's own hash (the occurrence it waits for, the last one fired, how many it fired
and skipped) is read with them.
"""

from __future__ import annotations

import datetime
from typing import Any

import redis
import redis.cluster
from msgspec import Struct

from carmy_worker.runtime.presence import pid_of
from carmy_worker.store import keys
from carmy_worker.store.jobstore import rfc3339
from carmy_worker.wire import record_decoder
from chaos.facts import Facts
from chaos.jobcheck import JobTable

Client = redis.Redis | redis.cluster.RedisCluster
# Fields too large, or binary, to be worth showing: the job's arguments and result bodies.
UNSHOWN = frozenset({"payload", "result"})


class ExecutionSeen(Struct, kw_only=True):
    """One execution of an occurrence's job: its hash (``None``: gone) and record, if any."""

    xid: str
    fields: dict[str, str] | None
    record_status: str | None = None
    record_error: str | None = None


class OccurrenceSeen(Struct, kw_only=True):
    """What the store holds for one occurrence: its request id, the job its idempotency key
    names (``None``: no key), that job's hash (``None``: gone or never written), and its
    executions in the order the job lists them."""

    at: str  # the occurrence, RFC 3339
    rid: str
    job_id: str | None
    job: dict[str, str] | None
    executions: list[ExecutionSeen]
    due_score: int | None = None  # the job's score in its tool's due set (ms; None: not there)


class ScheduleSeen(Struct, kw_only=True):
    """The schedule's hash as the end read it, and each missed occurrence's trail."""

    state: dict[str, str]
    occurrences: list[OccurrenceSeen]


def read_missed(client: Client, name: str, missed_ms: list[int]) -> ScheduleSeen:
    """The schedule ``name``'s state, and what the store holds for each occurrence of ``missed_ms``."""
    return ScheduleSeen(state=_hash(client, keys.schedule(name)) or {},
                        occurrences=[_occurrence(client, name, at) for at in missed_ms])


def _occurrence(client: Client, name: str, at: int) -> OccurrenceSeen:
    rid = f"schedule:{name}@{rfc3339(at)}"
    raw: Any = client.get(keys.schedule_idempotency(name, rid))
    job_id = _text(raw).split(" ", 1)[0] if raw else None
    job = _hash(client, keys.job(job_id)) if job_id else None
    xids = (job or {}).get("executions", "").split()
    score: Any = None
    if job_id and job and "tool" in job:
        score = client.zscore(keys.job_due(job["tool"], keys.partition_of(job_id)), job_id)
    return OccurrenceSeen(at=rfc3339(at), rid=rid, job_id=job_id, job=job,
                          executions=[_execution(client, xid) for xid in xids],
                          due_score=None if score is None else int(score))


def _execution(client: Client, xid: str) -> ExecutionSeen:
    raw: Any = client.get(keys.record(xid))
    record = None if raw is None else record_decoder.decode(raw)
    return ExecutionSeen(xid=xid, fields=_hash(client, keys.execution(xid)),
                         record_status=None if record is None else record.status,
                         record_error=None if record is None else record.error_code)


def _hash(client: Client, key: str) -> dict[str, str] | None:
    found: Any = client.hgetall(key)
    if not found:
        return None
    return {_text(k): _text(v) for k, v in found.items() if _text(k) not in UNSHOWN}


def summary(occurrence: OccurrenceSeen) -> str:
    """One line for people: where the occurrence's trail stops."""
    if occurrence.job_id is None:
        return f"{occurrence.at}: no job (its idempotency key is absent: never fired, or the write was lost)"
    job = occurrence.job
    if job is None:
        return f"{occurrence.at}: job {occurrence.job_id} named by its key, but its hash is gone"
    head = (f"{occurrence.at}: job {occurrence.job_id} {job.get('status')} after {job.get('attempts', '0')} "
            f"attempt(s)")
    if not occurrence.executions:
        return head + ", never promoted" + _due_line(occurrence)
    return head + "; " + "; ".join(_execution_line(e) for e in occurrence.executions)


def _due_line(occurrence: OccurrenceSeen) -> str:
    """Where a job never promoted stands in its tool's due set: leased (how far past its due), or not there."""
    if occurrence.due_score is None:
        return "; not in its tool's due set"
    due = int((occurrence.job or {}).get("due", "0") or 0)
    ahead = occurrence.due_score - due
    return f"; in its tool's due set {ahead} ms past its due" + (" (a LOOK's lease)" if ahead > 0 else "")


def _execution_line(e: ExecutionSeen) -> str:
    if e.fields is None:
        return f"{e.xid}: hash gone"
    shown = ", ".join(f"{k} {e.fields[k]}" for k in ("state", "attempt", "began", "reaped", "worker")
                      if k in e.fields)
    record = "no record" if e.record_status is None else f"record {e.record_status} {e.record_error or ''}".rstrip()
    return f"{e.xid}: {shown}; {record}"


def uncertain_at_a_kill(occurrence: OccurrenceSeen, killed: dict[int, float], at_s: float) -> bool:
    """Whether the occurrence was not run because its worker was killed (``kill -9``, at or after
    the occurrence) between marking its tool begun and the tool's first line in the ledger: its
    job dead-lettered, an execution that ``began`` on that worker and settled
    ``EXECUTION_UNCERTAIN``. For a tool that is not idempotent that is the promise kept (at most
    once: nobody can tell whether it ran, so it is not run again), not a second missed; the
    calls' rows count the same case as "uncertain although the tool never started" (info)."""
    if occurrence.job is None or occurrence.job.get("status") != "dead_lettered":
        return False
    for e in occurrence.executions:
        fields = e.fields or {}
        pid = pid_of(fields.get("worker", ""))
        if ("began" in fields and e.record_error == "EXECUTION_UNCERTAIN" and pid is not None
                and killed.get(pid, 0.0) >= at_s):
            return True
    return False


def excused_at_kill(jobs: JobTable, missed: ScheduleSeen, facts: Facts) -> None:
    """Takes out of the missed occurrences those the store shows uncertain at a worker's kill -9
    (``uncertain_at_a_kill``), and counts them apart. ``missed`` was read for
    ``jobs.missed``, in its order."""
    kept = []
    for at, seen in zip(jobs.missed, missed.occurrences, strict=True):
        if uncertain_at_a_kill(seen, facts.killed, datetime.datetime.fromisoformat(at).timestamp()):
            jobs.uncertain_at_kill += 1
        else:
            kept.append(at)
    jobs.missed = kept


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
