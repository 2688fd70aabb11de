"""The reconciliation: what the callers were told, set against the ledger the tools kept and the
faults that were injected. Pure functions of those records, so the tests can feed them made-up
histories.

Definitions (README, "Chaos check"):

* **lost**: a request that was accepted (the ledger shows a run, or the API gave it an execution
  id) and has no final answer at the end; or whose executions are more than one (its record was
  gone, so a retry started it over); or whose accepted execution a GET no longer knew (404).
* **duplicated effect**: two ``effect`` lines for one request of a non-idempotent tool.
* **flipped**: two different final answers (execution id, status, code, data) for one request.
* **completed without its effect**: a ``completed`` answer although the ledger has no effect of
  that execution by the worker process the answer names (the tools return their pid).
* **false uncertain**: ``EXECUTION_UNCERTAIN`` although the tool's effect landed before the
  verdict on a worker that was neither killed before the verdict nor paused at any moment
  between the effect and the verdict: it was alive and running, and could have recorded it.
  (An effect followed by a pause before it was recorded is a true uncertainty: counted as info.)
* **effect after verdict**: an ``effect`` line later than the moment the caller was first told
  ``EXECUTION_UNCERTAIN``; a violation beyond ``Bounds.after_verdict`` seconds.
* **lock overlap**: two runs of a ``parallel_safe=False`` tool whose ledger intervals (started
  to effect or abandoned; to the kill of its worker if it never ended) overlap. A run abandoned
  within ``facts.FROZEN_S`` of the end of a pause of its worker ends where the pause began: frozen,
  then stopped by its runtime on waking, it did nothing in between.
* **hang**: no final answer (nor a final refusal) within ``Bounds.patience`` of the first attempt.
* **detection time**: from a worker's ``kill -9`` to the first sign that each execution it was
  running was dealt with: a final answer to its caller, or a run started on another worker.
* **in Redis's loss window** (info, beside the violations, never instead of them): of the
  requests a violation names, those with an attempt under way within ``facts.LOSS_WINDOW_S``
  before a Redis ``kill -9`` or failover, whose writes Redis itself may have lost (the last
  second of an ``everysec`` AOF, what the primary had not yet replicated).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict

from msgspec import Struct

from chaos.auditcheck import AuditTable
from chaos.calls import REFUSAL_CODES
from chaos.facts import Facts
from chaos.hookcheck import HookTable
from chaos.imported import ImportedTable
from chaos.jobcheck import JobTable
from chaos.model import Answer, Attempt, Fault, LedgerLine, Request
from chaos.streams import StreamTable

UNCERTAIN = "EXECUTION_UNCERTAIN"


class Bounds(Struct, frozen=True, kw_only=True):
    patience: float = 30.0  # seconds a request may take to its final answer before it is a hang
    slow: float = 10.0  # seconds past which an answer is counted slow (info)
    after_verdict: float = 1.0  # seconds an effect may land after an uncertain verdict


class Table(Struct, kw_only=True):
    """The reconciliation's findings. Lists hold request ids (or pairs), so a run can be dug into."""

    requests: int
    burst: int
    # with arguments (and so results) large enough to be staged (chaos.load.LARGE_EVERY), and of
    # those, how many were answered: their losses and flips are counted with every other's
    large: int = 0
    large_answered: int = 0
    answered: int
    refused: int
    attempts: int
    statuses: dict[str, int]
    lost: list[str]
    duplicated_effects: list[str]
    flipped: list[str]
    unfounded: list[str]  # completed without its effect
    false_uncertain: list[str]
    effects_after_verdict: list[str]  # beyond the bound
    after_verdict_delays: list[float]  # every effect after a verdict, seconds
    lock_overlaps: list[str]
    hangs: list[str]
    slow: int
    detection: list[float]
    uncertain: int
    uncertain_unstarted: int  # the ledger shows the tool never started: uncertain for nothing
    uncertain_after_pause: int
    idempotent_reruns: int
    double_starts: int
    false_store_unavailable: list[float]  # when each such attempt was sent (wall clock)
    false_no_workers: list[float]
    in_loss_window: list[str]  # of the requests the violations name
    faults: dict[str, int]
    bounds: Bounds
    jobs: JobTable | None = None  # chaos.jobcheck's rows, when the load made jobs
    hooks: HookTable | None = None  # chaos.hookcheck's rows, when the load sent webhooks
    audit: AuditTable | None = None  # chaos.auditcheck's rows
    streams: StreamTable | None = None  # chaos.streams' rows, when the load made streams without a request id
    imported: ImportedTable | None = None  # chaos.imported's rows, when the load called the imported tool

    def violations(self) -> dict[str, int]:
        """The broken promises, by row: a run passes when this is empty."""
        found = {"lost": len(self.lost), "duplicated effects": len(self.duplicated_effects),
                 "flipped answers": len(self.flipped), "completed without its effect": len(self.unfounded),
                 "false uncertain": len(self.false_uncertain),
                 "effects after verdict": len(self.effects_after_verdict),
                 "lock overlaps": len(self.lock_overlaps), "hangs": len(self.hangs)}
        violated = {name: n for name, n in found.items() if n}
        violated |= self.jobs.violations() if self.jobs else {}
        violated |= self.hooks.violations() if self.hooks else {}
        violated |= self.streams.violations() if self.streams else {}
        violated |= self.imported.violations() if self.imported else {}
        return violated | (self.audit.violations() if self.audit else {})

    def about_records(self) -> set[str]:
        """The requests named by the rows a lost Redis write can explain: the records' rows,
        not the lock's nor the patience's."""
        return {rid for rids in (self.lost, self.duplicated_effects, self.flipped, self.unfounded,
                                 self.false_uncertain, self.effects_after_verdict) for rid in rids}


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile (q in 0..100), or None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def answers(request: Request) -> list[tuple[float, Answer]]:
    """Every final answer the request got, with when it arrived (wall clock), in order."""
    return sorted((a.t1, a.answer) for a in request.attempts if a.answer is not None)


def refused(request: Request) -> bool:
    return any(a.code in REFUSAL_CODES and a.answer is None for a in request.attempts)


def settled_at(request: Request) -> float | None:
    """When the request had its first final answer, or final refusal."""
    times = [a.t1 for a in request.attempts
             if a.answer is not None or (a.code in REFUSAL_CODES and a.answer is None)]
    return min(times) if times else None


def verdict_at(request: Request) -> float | None:
    """When the caller was first told EXECUTION_UNCERTAIN."""
    times = [t for t, answer in answers(request) if answer.code == UNCERTAIN]
    return min(times) if times else None


def lost(request: Request, facts: Facts) -> bool:
    accepted = {line.xid for line in facts.by_rid.get(request.rid, [])}
    accepted |= {a.execution_id for a in request.attempts if a.execution_id}
    given = {answer.execution_id for _, answer in answers(request)}
    gone = any(a.gone for a in request.attempts)
    return gone or len(accepted | given) > 1 or (bool(accepted) and not given)


def unfounded(request: Request, facts: Facts) -> bool:
    """Whether a ``completed`` answer names a run that the ledger says did not do its effect."""
    for _, answer in answers(request):
        if answer.status != "completed":
            continue
        pids = {line.pid for line in facts.lines(request.rid, "effect") if line.xid == answer.execution_id}
        data = json.loads(answer.data or "null")
        if not isinstance(data, dict) or data.get("pid") not in pids:
            return True
    return False


def uncertainty(request: Request, facts: Facts) -> str | None:
    """``false``, ``after pause`` (a true uncertainty: the effect landed, then its worker was
    paused before recording it) or None (no effect before the verdict, or its worker was killed)."""
    verdict = verdict_at(request)
    if verdict is None:
        return None
    kinds = set()
    for effect in facts.lines(request.rid, "effect"):
        if effect.t > verdict:
            continue
        killed = facts.killed.get(effect.pid)
        if killed is not None and killed <= verdict:
            continue
        kinds.add("after pause" if facts.paused_between(effect.pid, effect.t, verdict) else "false")
    return "false" if "false" in kinds else ("after pause" if kinds else None)


def after_verdict(request: Request, facts: Facts) -> list[float]:
    verdict = verdict_at(request)
    if verdict is None:
        return []
    return [line.t - verdict for line in facts.lines(request.rid, "effect") if line.t > verdict]


def runs(facts: Facts, tools: set[str]) -> list[tuple[float, float, str]]:
    """(start, end, request id) of every run of ``tools``, from the ledger."""
    found = []
    for rid, lines in facts.by_rid.items():
        for start in (line for line in lines if line.ev == "started" and line.tool in tools):
            ends = [line for line in lines if line.ev != "started" and line.pid == start.pid
                    and line.xid == start.xid and line.t >= start.t]
            end = min(line.t for line in ends) if ends else facts.killed.get(start.pid, start.t)
            if ends and min(ends, key=lambda line: line.t).ev == "abandoned":
                end = facts.frozen_from(start.pid, start.t, end) or end
            found.append((start.t, end, rid))
    return sorted(found)


def overlaps(intervals: list[tuple[float, float, str]]) -> list[str]:
    pairs = []
    for i, (_, end, rid) in enumerate(intervals):
        for start2, _, rid2 in intervals[i + 1:]:
            if start2 >= end:
                break
            pairs.append(f"{rid}/{rid2}")
    return pairs


def detection_times(requests: dict[str, Request], facts: Facts) -> list[float]:
    """For each run a ``kill -9`` interrupted: seconds until its caller was answered or it ran again."""
    times = []
    for fault in facts.faults:
        if fault.kind != "worker-kill":
            continue
        for rid, lines in facts.by_rid.items():
            for start in (line for line in lines if line.ev == "started" and line.pid == fault.pid
                          and line.t <= fault.t):
                if any(line.ev != "started" and line.xid == start.xid and line.pid == fault.pid for line in lines):
                    continue  # it ended before the kill
                signs = [line.t for line in lines if line.ev == "started" and line.pid != fault.pid
                         and line.t > fault.t]
                request = requests.get(rid)
                if request is not None:
                    signs += [t for t, _ in answers(request) if t > fault.t]
                if signs:
                    times.append(min(signs) - fault.t)
    return times


def false_refusals(requests: list[Request], facts: Facts, n_workers: int) -> tuple[list[float], list[float]]:
    """When attempts were answered STORE_UNAVAILABLE while Redis was up, and NO_WORKERS while a
    worker was alive and not paused (one fault at a time leaves n - 1 of them)."""
    store: list[float] = []
    workers: list[float] = []
    attempts: list[Attempt] = [a for r in requests for a in r.attempts]
    for a in attempts:
        if a.code == "STORE_UNAVAILABLE" and not facts.redis_was_down(a.t0, a.t1):
            store.append(a.t0)
        if a.code == "NO_WORKERS" and sum(t <= a.t0 <= t_end for t, t_end in facts.workers_out) < n_workers:
            workers.append(a.t0)
    return sorted(store), sorted(workers)


def loss_window(table: Table, by_rid: dict[str, Request], facts: Facts) -> list[str]:
    """The requests a violation names that had an attempt under way in Redis's loss window."""
    return sorted(rid for rid in table.about_records() if rid in by_rid
                  and any(facts.in_loss_window(a.t0, a.t1) for a in by_rid[rid].attempts))


def status_counts(requests: list[Request]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for request in requests:
        given = answers(request)
        if given:
            answer = given[0][1]
            counts[answer.code or answer.status] += 1
    return dict(sorted(counts.items()))


def reconcile(requests: list[Request], ledger: list[LedgerLine], faults: list[Fault], idempotent: dict[str, bool],
              exclusive: set[str], bounds: Bounds, n_workers: int) -> Table:
    facts = Facts(ledger, faults)
    by_rid = {r.rid: r for r in requests}
    kinds = {r.rid: uncertainty(r, facts) for r in requests}
    delays = {r.rid: after_verdict(r, facts) for r in requests}
    store, workers = false_refusals(requests, facts, n_workers)
    fault_counts: dict[str, int] = defaultdict(int)
    for fault in faults:
        fault_counts[fault.kind] += 1

    def took(r: Request) -> float | None:
        settled = settled_at(r)
        return None if settled is None else settled - r.first

    def effects(r: Request) -> int:
        return len(facts.lines(r.rid, "effect"))

    def starts(r: Request) -> int:
        return len(facts.lines(r.rid, "started"))

    table = Table(
        requests=len(requests), burst=sum(r.kind == "burst" for r in requests),
        large=sum("pad" in r.args for r in requests),
        large_answered=sum("pad" in r.args and bool(answers(r)) for r in requests),
        answered=sum(bool(answers(r)) for r in requests), refused=sum(refused(r) and not answers(r) for r in requests),
        attempts=sum(len(r.attempts) for r in requests), statuses=status_counts(requests),
        lost=[r.rid for r in requests if lost(r, facts)],
        duplicated_effects=[r.rid for r in requests if not idempotent.get(r.tool, False) and effects(r) > 1],
        flipped=[r.rid for r in requests if len({a for _, a in answers(r)}) > 1],
        unfounded=[r.rid for r in requests if unfounded(r, facts)],
        false_uncertain=[rid for rid, kind in kinds.items() if kind == "false"],
        effects_after_verdict=[rid for rid, d in delays.items() if any(x > bounds.after_verdict for x in d)],
        after_verdict_delays=sorted(x for d in delays.values() for x in d),
        lock_overlaps=overlaps(runs(facts, exclusive)),
        hangs=[r.rid for r in requests if (t := took(r)) is None or t > bounds.patience],
        slow=sum(bounds.slow < t <= bounds.patience for r in requests if (t := took(r)) is not None),
        detection=detection_times(by_rid, facts),
        uncertain=sum(verdict_at(r) is not None for r in requests),
        uncertain_unstarted=sum(verdict_at(r) is not None and not starts(r) for r in requests),
        uncertain_after_pause=sum(kind == "after pause" for kind in kinds.values()),
        idempotent_reruns=sum(idempotent.get(r.tool, False) and starts(r) > 1 for r in requests),
        double_starts=sum(not idempotent.get(r.tool, False) and starts(r) > 1 for r in requests),
        false_store_unavailable=store, false_no_workers=workers, in_loss_window=[], faults=dict(fault_counts),
        bounds=bounds,
    )
    table.in_loss_window = loss_window(table, by_rid, facts)
    return table
