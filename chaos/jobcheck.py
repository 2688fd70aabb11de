"""The reconciliation of jobs: what the API said of each job (``Job``: its creation and reads)
set against the runs the ledger kept, and the schedule's occurrences against the clock. Pure
functions, as ``chaos.reconcile`` is. A run's attempt is read from its request id
(``model.attempt_of``: ``{request_id}#{n}`` for attempt n >= 2).

Definitions (each a violation):

* **lost**: a job given a job id, or whose runs are in the ledger, that is not finished at its
  last read, or that a read no longer found (404), or that was given two job ids.
* **run twice**: one attempt (one request id) run by two executions; or two effects of a job of
  a non-idempotent tool (over all its attempts). An idempotent attempt run again under the same
  execution (its worker died) is allowed, and counted as info.
* **early**: a run that started before its job was due (``run_at``, or ``created_at`` plus
  ``delay_ms``, both by Redis's clock; a scheduled occurrence's time), or before the backoff
  after the attempt before it failed (at least ``base · 2^(n-1)`` capped, after attempt n), by
  more than ``TOLERANCE_MS``: the ledger's clock is the tool's.
* **uncertain, run again**: a job of a non-idempotent tool (a scheduled one too) with an attempt
  after one that started and did not fail on purpose (it may have had its effect); or whose attempt
  was under way when its worker was killed, and which did not end ``dead_lettered`` with
  ``EXECUTION_UNCERTAIN``.
* **unlike its runs**: the last read disagrees with the ledger: attempts not one per execution,
  a run of an attempt the job does not list under that execution, a ``succeeded`` job whose
  ``result`` is not its last attempt's effect (execution, process, request id), a dead letter
  with attempts left and no uncertainty, or an end this load never asks for (``failed``,
  ``cancelled``: no job is cancelled, no error is final).
* **flipped**: a read that differs from an earlier one that found the job finished.
* **fired twice**: a scheduled occurrence run by two executions under one request id (two jobs
  for it, or one attempt promoted twice), or with two effects of a non-idempotent tool.
* **missed**: an occurrence between the first one run and the cutoff with no run at all, unless
  no worker could fire it within its grace (Redis was down from the occurrence to its grace's end;
  the faults never take every worker out at once).
  The end (``chaos.scheduleread.excused_at_kill``) then takes out those the store shows uncertain at a
  worker's ``kill -9`` (``chaos.scheduleread.uncertain_at_a_kill``): the promise kept, counted apart.

As for calls, the jobs and occurrences a violation names that were created or run within
``facts.LOSS_WINDOW_S`` before a Redis ``kill -9`` or failover are counted apart (info): under
``appendfsync everysec`` Redis itself may have lost what they wrote.
"""

from __future__ import annotations

import datetime
import json
from collections import defaultdict

from msgspec import Struct

from chaos.facts import Facts
from chaos.model import Job, JobRead, LedgerLine, attempt_of

TOLERANCE_MS = 5  # the tool's wall clock against Redis's, on one machine: rounding to the ms
FINISHED = frozenset({"succeeded", "failed", "dead_lettered", "cancelled"})
UNCERTAIN = "EXECUTION_UNCERTAIN"
SCHEDULED = "schedule:"  # the request id of an occurrence's job: schedule:{name}@{RFC 3339}


class JobTable(Struct, kw_only=True):
    """The jobs' findings. Lists hold request ids (occurrences for the schedule's)."""

    jobs: int
    delayed: int  # created with delay_ms (the others with run_at)
    planned_failures: int  # jobs whose first attempts fail on purpose
    unanswered: int  # never given a job id, and never run
    statuses: dict[str, int]  # at the last read
    uncertain_dead: int  # dead_lettered with EXECUTION_UNCERTAIN
    interrupted: int  # jobs of non-idempotent tools with an attempt under way at a kill -9
    attempts: int  # runs of job attempts in the ledger
    idempotent_reruns: int  # an attempt run again under its execution (its worker died)
    lateness: list[float]  # seconds from when each job was due to its first run
    lost: list[str]
    run_twice: list[str]
    early: list[str]
    rerun_uncertain: list[str]
    unlike_runs: list[str]
    flipped: list[str]
    occurrences: int  # scheduled occurrences run
    fired_twice: list[str]
    missed: list[str]
    excused: int  # occurrences no worker could fire within their grace
    # occurrences not run because a kill -9 took their worker after it marked the tool begun and
    # before the tool started: dead-lettered uncertain, the at-most-once promise (chaos.scheduleread)
    uncertain_at_kill: int = 0
    in_loss_window: list[str] = []  # of the jobs and occurrences the violations name (info)

    def violations(self) -> dict[str, int]:
        found = {"jobs lost": len(self.lost), "jobs run twice": len(self.run_twice),
                 "jobs started early": len(self.early), "uncertain jobs run again": len(self.rerun_uncertain),
                 "jobs unlike their runs": len(self.unlike_runs), "jobs flipped": len(self.flipped),
                 "occurrences fired twice": len(self.fired_twice), "occurrences missed": len(self.missed)}
        return {name: n for name, n in found.items() if n}

    def named(self) -> set[str]:
        """The request ids the violations name."""
        return {rid for rids in (self.lost, self.run_twice, self.early, self.rerun_uncertain, self.unlike_runs,
                                 self.flipped, self.fired_twice) for rid in rids}


def ms_of(rfc3339: str) -> int:
    return round(datetime.datetime.fromisoformat(rfc3339).timestamp() * 1000)


def request_id(base: str, attempt: int) -> str:
    return base if attempt == 1 else f"{base}#{attempt}"


def by_job(ledger: list[LedgerLine], tools: set[str]) -> dict[str, list[LedgerLine]]:
    """The lines of job attempts, by the job's request id."""
    found: dict[str, list[LedgerLine]] = defaultdict(list)
    for line in ledger:
        if line.tool in tools:
            found[attempt_of(line.rid)[0]].append(line)
    return found


def starts(lines: list[LedgerLine]) -> list[LedgerLine]:
    return [line for line in lines if line.ev == "started"]


def ran_twice(lines: list[LedgerLine], idempotent: bool) -> bool:
    executions: dict[str, set[str]] = defaultdict(set)
    for line in starts(lines):
        executions[line.rid].add(line.xid)
    effects = sum(line.ev == "effect" for line in lines)
    return any(len(xids) > 1 for xids in executions.values()) or (not idempotent and effects > 1)


def reruns(lines: list[LedgerLine]) -> int:
    """Attempts started more than once under one execution."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for line in starts(lines):
        counts[line.rid, line.xid] += 1
    return sum(n > 1 for n in counts.values())


def due_ms(job: Job) -> int | None:
    """When ``job`` was due (unix ms, Redis's clock), or None if no read gave its creation time."""
    if job.run_at is not None:
        return ms_of(job.run_at)
    created = [read.created_ms for read in job.reads if read.created_ms]
    return min(created) + (job.delay_ms or 0) if created else None


def started_early(lines: list[LedgerLine], due: int | None) -> bool:
    return due is not None and any(line.t * 1000 < due - TOLERANCE_MS for line in starts(lines))


def retried_early(lines: list[LedgerLine], backoff: tuple[int, int]) -> bool:
    """An attempt that started sooner after the failure of the one before than the least backoff
    (``backoff``: the tool's base and cap, ms; jitter only lengthens it)."""
    base, cap = backoff
    failed: dict[int, float] = {}
    for line in lines:
        if line.ev == "failed":
            n = attempt_of(line.rid)[1]
            failed[n] = min(failed.get(n, line.t), line.t)
    return any(line.t * 1000 < failed[n - 1] * 1000 + min(base * 2 ** (n - 2), cap) - TOLERANCE_MS
               for line in starts(lines) if (n := attempt_of(line.rid)[1]) - 1 in failed)


def ended(lines: list[LedgerLine], start: LedgerLine) -> list[LedgerLine]:
    return [line for line in lines if line.ev != "started" and line.xid == start.xid and line.pid == start.pid
            and line.t >= start.t]


def interrupted(lines: list[LedgerLine], facts: Facts) -> list[LedgerLine]:
    """Starts whose worker was killed before the run ended."""
    return [start for start in starts(lines) if not ended(lines, start)
            and facts.killed.get(start.pid, 0.0) > start.t]


def ran_after_uncertain(lines: list[LedgerLine]) -> bool:
    """For a job of a non-idempotent tool: an attempt started after one that may have had its
    effect (it started and did not fail on purpose)."""
    failed = {line.rid for line in lines if line.ev == "failed"}
    attempts = [attempt_of(line.rid)[1] for line in starts(lines)]
    uncertain = [attempt_of(line.rid)[1] for line in starts(lines) if line.rid not in failed]
    return bool(uncertain) and max(attempts) > min(uncertain)


def interrupted_not_dead(lines: list[LedgerLine], last: JobRead, facts: Facts) -> bool:
    """For a job of a non-idempotent tool: an attempt under way when its worker was killed, and
    the job not ``dead_lettered`` as uncertain."""
    return bool(interrupted(lines, facts)) and (last.status, last.error) != ("dead_lettered", UNCERTAIN)


def unlike_runs(job: Job, lines: list[LedgerLine], last: JobRead, idempotent: bool) -> bool:
    if last.attempts != len(last.executions):
        return True
    for line in lines:
        n = attempt_of(line.rid)[1]
        if n > last.attempts or line.xid != last.executions[n - 1]:
            return True
    if last.status == "succeeded":
        return not result_is_last_run(job, lines, last)
    if last.status == "dead_lettered":
        return last.attempts < job.max_attempts and (idempotent or last.error != UNCERTAIN)
    return True  # failed or cancelled: nothing in this load asks for either


def result_is_last_run(job: Job, lines: list[LedgerLine], last: JobRead) -> bool:
    result = json.loads(last.result or "null")
    if not isinstance(result, dict) or result.get("status") != "completed" or not last.executions:
        return False
    data = result.get("data") or {}
    xid, rid = last.executions[-1], request_id(job.rid, last.attempts)
    pids = {line.pid for line in lines if line.ev == "effect" and line.xid == xid and line.rid == rid}
    return result.get("execution_id") == xid and data.get("request_id") == rid and data.get("pid") in pids


def flipped(reads: list[JobRead]) -> bool:
    done: JobRead | None = None
    for read in sorted(reads, key=lambda r: r.t):
        if done is not None and read.state() != done.state():
            return True
        if done is None and read.status in FINISHED:
            done = read
    return False


def lost(job: Job, lines: list[LedgerLine]) -> bool:
    if len(job.job_ids()) > 1:
        return True
    if not job.job_ids():
        return bool(lines)  # it ran, but its caller never learnt its id
    found = any(read.status is not None for read in job.reads)
    return not job.reads or job.reads[-1].status not in FINISHED or (found and any(
        read.status is None for read in job.reads))


def occurrences(ledger: list[LedgerLine], tools: set[str]) -> dict[int, list[LedgerLine]]:
    """The schedule's runs by occurrence (unix ms), from their request ids."""
    found: dict[int, list[LedgerLine]] = defaultdict(list)
    for line in ledger:
        base = attempt_of(line.rid)[0]
        if line.tool in tools and base.startswith(SCHEDULED):
            found[ms_of(base.rsplit("@", 1)[1])].append(line)
    return found


def missed(runs: dict[int, list[LedgerLine]], facts: Facts, cutoff: float, grace: float,
           period_ms: int = 1000) -> tuple[list[int], int]:
    """Occurrences from the first run to ``cutoff`` (wall clock) with no run: (those a worker
    could have fired within ``grace``, how many no worker could)."""
    if not runs:
        return [], 0
    gone, excused = [], 0
    for at in range(min(runs), int(cutoff * 1000) + 1, period_ms):
        if starts(runs.get(at, [])):
            continue
        t = at / 1000
        if any(down <= t and t + grace <= up for down, up in facts.redis_down):
            excused += 1
        else:
            gone.append(at)
    return gone, excused


def reconcile_jobs(jobs: list[Job], ledger: list[LedgerLine], facts: Facts, idempotent: dict[str, bool],
                   job_tools: set[str], cutoff: float, grace: float, backoff: tuple[int, int] = (0, 0)) -> JobTable:
    """The jobs' rows. ``cutoff``: the schedule's occurrences are checked up to this instant, with
    its ``grace``; ``backoff``: the job tools' retry policy (base and cap, ms)."""
    runs = by_job(ledger, job_tools)
    table = _counted(jobs, runs, facts, idempotent)
    for job in jobs:
        for row, broken in _checks(job, runs.get(job.rid, []), idempotent.get(job.tool, False), facts,
                                   backoff).items():
            if broken:
                getattr(table, row).append(job.rid)
    _schedule(table, ledger, facts, idempotent, job_tools, cutoff, grace)
    table.in_loss_window = loss_window(table.named(), jobs, runs, facts)
    return table


def _checks(job: Job, lines: list[LedgerLine], once: bool, facts: Facts, backoff: tuple[int, int]) -> dict[str, bool]:
    """Whether ``job`` (``once``: of an idempotent tool) broke each promise, by the table's row."""
    last = job.reads[-1] if job.reads else None
    return {
        "lost": lost(job, lines), "run_twice": ran_twice(lines, once),
        "early": started_early(lines, due_ms(job)) or retried_early(lines, backoff),
        "flipped": flipped(job.reads),
        "rerun_uncertain": not once and (ran_after_uncertain(lines) or (
            last is not None and interrupted_not_dead(lines, last, facts))),
        "unlike_runs": last is not None and last.status in FINISHED and unlike_runs(job, lines, last, once),
    }


def _counted(jobs: list[Job], runs: dict[str, list[LedgerLine]], facts: Facts,
             idempotent: dict[str, bool]) -> JobTable:
    """The table's counts (info), with every violation list empty."""
    lasts = [job.reads[-1] for job in jobs if job.reads]
    statuses: dict[str, int] = defaultdict(int)
    for last in lasts:
        statuses[str(last.status)] += 1
    lateness = []
    for job in jobs:
        first, due = starts(runs.get(job.rid, [])), due_ms(job)
        if first and due is not None:
            lateness.append(min(line.t for line in first) - due / 1000)
    return JobTable(
        jobs=len(jobs), delayed=sum(job.delay_ms is not None for job in jobs),
        planned_failures=sum(job.args.get("fail", 0) > 0 for job in jobs),
        unanswered=sum(not job.job_ids() and not runs.get(job.rid) for job in jobs),
        statuses=dict(sorted(statuses.items())),
        uncertain_dead=sum((last.status, last.error) == ("dead_lettered", UNCERTAIN) for last in lasts),
        interrupted=sum(not idempotent.get(job.tool, False) and bool(interrupted(runs.get(job.rid, []), facts))
                        for job in jobs),
        attempts=sum(len(starts(runs.get(job.rid, []))) for job in jobs),
        idempotent_reruns=sum(reruns(runs.get(job.rid, [])) for job in jobs), lateness=sorted(lateness),
        lost=[], run_twice=[], early=[], rerun_uncertain=[], unlike_runs=[], flipped=[],
        occurrences=0, fired_twice=[], missed=[], excused=0)


def loss_window(named: set[str], jobs: list[Job], runs: dict[str, list[LedgerLine]], facts: Facts) -> list[str]:
    """Of ``named``, the jobs (and occurrences) created or run in Redis's loss window."""
    creates = {job.rid: [(c.t0, c.t1) for c in job.creates] for job in jobs}
    return sorted(rid for rid in named if any(
        facts.in_loss_window(t0, t1) for t0, t1 in [(line.t, line.t) for line in runs.get(rid, [])]
        + creates.get(rid, [])))


def _schedule(table: JobTable, ledger: list[LedgerLine], facts: Facts, idempotent: dict[str, bool],
              job_tools: set[str], cutoff: float, grace: float) -> None:
    by_occurrence = occurrences(ledger, job_tools)
    table.occurrences = sum(bool(starts(lines)) for lines in by_occurrence.values())
    for at, lines in sorted(by_occurrence.items()):
        name, once = attempt_of(lines[0].rid)[0], idempotent.get(lines[0].tool, False)
        if ran_twice(lines, once):
            table.fired_twice.append(name)
        if started_early(lines, at):
            table.early.append(name)
        if not once and ran_after_uncertain(lines):
            table.rerun_uncertain.append(name)
    gone, table.excused = missed(by_occurrence, facts, cutoff, grace)
    table.missed = [datetime.datetime.fromtimestamp(at / 1000, tz=datetime.UTC).isoformat() for at in gone]
