"""The chaos check's one table, as markdown text for people and as JSON for ``--out``."""

from __future__ import annotations

from typing import Any

import msgspec

from chaos.auditcheck import AuditTable
from chaos.hookcheck import HookTable
from chaos.imported import ImportedTable
from chaos.jobcheck import TOLERANCE_MS, JobTable
from chaos.model import Event, Job, LedgerLine, Request, Stream, Trail
from chaos.reconcile import Table, percentile
from chaos.streams import StreamTable

EXAMPLES = 3  # request ids quoted per violated row
DOORS, DOOR = 6, 24  # audit entries' doors shown, and the characters of each name


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def promise(name: str, found: list[str], value: str | None = None) -> tuple[str, str, str]:
    shown = value if value is not None else str(len(found))
    if found:
        shown += " (e.g. " + ", ".join(found[:EXAMPLES]) + ")"
    return name, shown, "VIOLATION" if found else "ok"


def _msec(seconds: float | None) -> str:
    """Below a second in ms, else as ``_ms``."""
    return f"{seconds * 1000:.0f} ms" if seconds is not None and abs(seconds) < 1 else _ms(seconds)


def rows(table: Table) -> list[tuple[str, str, str]]:
    """(row, value, verdict): ``ok`` or ``VIOLATION`` for a promise, ``info`` for the rest."""
    b = table.bounds
    delays = table.after_verdict_delays
    statuses = ", ".join(f"{name} {n}" for name, n in table.statuses.items()) or "-"
    return [
        ("requests", f"{table.requests} ({table.burst} in overload bursts; {table.attempts} attempts; "
                     f"{table.large} with large arguments, {table.large_answered} of them answered)", "info"),
        ("answered", f"{table.answered} ({statuses}); {table.refused} refused", "info"),
        promise("lost", table.lost),
        promise("duplicated effects (not idempotent)", table.duplicated_effects),
        ("re-runs of idempotent tools", str(table.idempotent_reruns), "info"),
        ("non-idempotent runs started twice, one effect", str(table.double_starts), "info"),
        promise("flipped answers", table.flipped),
        promise("completed without its effect", table.unfounded),
        promise("false uncertain", table.false_uncertain,
                f"{len(table.false_uncertain)} of {table.uncertain} uncertain"),
        ("uncertain after a pause (true uncertainty)", str(table.uncertain_after_pause), "info"),
        ("uncertain although the tool never started", str(table.uncertain_unstarted), "info"),
        promise(f"effects after verdict (> {b.after_verdict:g} s)", table.effects_after_verdict,
                f"{len(table.effects_after_verdict)} (all: {len(delays)}, max {_ms(max(delays) if delays else None)})"),
        promise("lock overlaps (parallel_safe=False)", table.lock_overlaps),
        promise(f"hangs (no final answer within {b.patience:g} s)", table.hangs),
        (f"slow answers ({b.slow:g} s to {b.patience:g} s)", str(table.slow), "info"),
        *(job_rows(table.jobs) if table.jobs else []),
        *(hook_rows(table.hooks) if table.hooks else []),
        *(stream_rows(table.streams) if table.streams else []),
        *(imported_rows(table.imported) if table.imported else []),
        *(audit_rows(table.audit) if table.audit else []),
        ("detection time after kill -9, p50 / max",
         f"{_ms(percentile(table.detection, 50))} / {_ms(max(table.detection) if table.detection else None)}"
         f" ({len(table.detection)} runs)", "info"),
        ("lost, duplicated, flipped, unfounded, false uncertain or late: in Redis's loss window",
         f"{len(table.in_loss_window)} of {len(table.about_records())} requests (under way 1 s before a "
         "kill -9 or failover, or in a hang)"
         + (" (e.g. " + ", ".join(table.in_loss_window[:EXAMPLES]) + ")" if table.in_loss_window else ""), "info"),
        ("503 STORE_UNAVAILABLE with Redis up", str(len(table.false_store_unavailable)), "info"),
        ("503 NO_WORKERS with a live worker", str(len(table.false_no_workers)), "info"),
        ("faults", ", ".join(f"{k} {n}" for k, n in sorted(table.faults.items())) or "none", "info"),
    ]


def job_rows(j: JobTable) -> list[tuple[str, str, str]]:
    statuses = ", ".join(f"{name} {n}" for name, n in j.statuses.items()) or "-"
    late = j.lateness
    return [
        ("jobs", f"{j.jobs} ({j.delayed} with delay_ms, {j.jobs - j.delayed} with run_at; {j.planned_failures} "
                 f"failing on purpose first; {j.attempts} attempts)", "info"),
        ("jobs at their last read", f"{statuses} ({j.uncertain_dead} dead-lettered EXECUTION_UNCERTAIN); "
                                    f"{j.unanswered} never given a job id", "info"),
        promise("jobs lost", j.lost),
        promise("jobs run twice (an attempt by two executions, a non-idempotent job's effect twice)", j.run_twice),
        ("re-runs of idempotent job attempts (same execution)", str(j.idempotent_reruns), "info"),
        promise(f"jobs started before they were due (run_at, delay, backoff; > {TOLERANCE_MS} ms)", j.early),
        ("non-idempotent jobs with an attempt under way at a kill -9", str(j.interrupted), "info"),
        promise("uncertain non-idempotent jobs run again, or not dead-lettered", j.rerun_uncertain),
        promise("jobs unlike their runs (attempts, executions, result)", j.unlike_runs),
        promise("jobs flipped after finishing", j.flipped),
        ("job lateness (first run - due), p50 / max",
         f"{_msec(percentile(late, 50))} / {_msec(max(late) if late else None)} ({len(late)} jobs)", "info"),
        ("schedule occurrences run (every second)",
         f"{j.occurrences} ({j.excused} missed while no worker could fire them within the grace)", "info"),
        promise("schedule occurrences fired twice", j.fired_twice),
        promise("schedule occurrences missed", j.missed),
        ("schedule occurrences not run, uncertain at a worker's kill -9 (begun, then killed before the tool started)",
         str(j.uncertain_at_kill), "info"),
        ("jobs and occurrences named above: in Redis's loss window",
         f"{len(j.in_loss_window)} of {len(j.named())} (created or run 1 s before a kill -9 or failover, "
         "or in a hang)", "info"),
    ]


def hook_rows(h: HookTable) -> list[tuple[str, str, str]]:
    answers = ", ".join(f"{status} {n}" for status, n in h.answers.items()) or "-"
    return [
        ("webhook events", f"{h.events} ({h.calls} mode call, {h.events - h.calls} mode job; {h.forged} forged; "
                           f"{h.redelivered} answered more than once; {h.deliveries} deliveries: {answers})", "info"),
        promise("webhook events run twice (two executions, or two effects)", h.run_twice),
        promise("webhook events lost or not replayed (two execution or job ids, or none)", h.not_replayed),
        promise("forged deliveries run, or answered other than 401", h.forged_ran),
        promise("webhook answers not as documented (401, 5xx but a 503 to retry, other refusals)", h.undocumented),
        ("callbacks", f"{h.callbacks} deliveries for {h.notify_jobs} finished jobs that asked ({h.refused} answered "
                      f"500 and {h.hung} left hanging on purpose, {h.repeats} repeats)", "info"),
        promise("callbacks lost (no verified delivery of the job's final status)", h.callbacks_lost),
        promise("callbacks forged (not verified, or for no such job)", h.callbacks_forged),
        promise("callback ids unstable (two webhook-ids, or not msg_<job>_<status>_<attempts>)", h.unstable_ids),
        promise("callbacks not shown delivered in the job's view", h.not_shown),
    ]


def stream_rows(t: StreamTable) -> list[tuple[str, str, str]]:
    refused = ", ".join(f"{code} {n}" for code, n in t.refused.items()) or "none"
    return [
        ("streams without a request id", f"{t.streams} ({t.ended} ended: {t.answered} answered; refused: {refused}; "
                                         f"{t.unavailable_recorded} of the STORE_UNAVAILABLE ones recorded after all; "
                                         f"{t.retried} carried a later attempt's progress)",
         "info"),
        promise("streams misnamed (execution.completed names another id than execution.started)", t.misnamed),
        promise("streamed answers without a record of the execution named", t.answered_unrecorded),
        promise("streamed answers unlike their records (status, code)", t.unlike),
        promise("streams refused by SUBMIT, yet their execution recorded", t.refused_recorded),
        promise("streams with an attempt's progress after a later attempt's", t.stale_progress),
    ]


def imported_rows(t: ImportedTable) -> list[tuple[str, str, str]]:
    answered = ", ".join(f"{how} {n}" for how, n in t.answered.items()) or "none"
    return [
        ("imported tool's calls (place_order, not idempotent, from an OpenAPI document)",
         f"{t.requests} ({answered}); the upstream got {t.sent} orders; {t.maybe_sent} answered as failed or "
         "uncertain had reached it", "info"),
        promise("imported calls sent to the upstream twice (one request id, two orders)", t.sent_twice),
        promise("imported calls sent under a key no request had", t.unasked),
        promise("imported calls completed, yet not sent (or with another order's number)", t.unfounded),
        promise("imported calls' answers flipped", t.flipped),
    ]


def doors(by_via: dict[str, int]) -> str:
    """The entries by door, the most common first: a few, each named shortly (a broken trail may
    write anything there, even arguments: a copy broken so on purpose wrote 553 of them)."""
    common = sorted(by_via.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{via if len(via) <= DOOR else via[:DOOR] + '…'} {n}" for via, n in common[:DOORS]) or "-"
    rest = common[DOORS:]
    return shown + (f", {len(rest)} other doors {sum(n for _, n in rest)}" if rest else "")


def audit_rows(a: AuditTable) -> list[tuple[str, str, str]]:
    vias = doors(a.by_via)
    return [
        ("audit entries", f"{a.entries} ({a.replayed} replays; by via: {vias}) for {a.records} records; "
                          f"{a.trimmed} trimmed", "info"),
        promise("executions finished without an audit entry (a record, no entry but replays)", a.unaudited,
                f"{len(a.unaudited)} ({a.unaudited_answered} answered to a caller)"),
        promise("executions audited twice (two entries, neither a replay)", a.twice),
        promise("audit entries unlike their records (tool, status, code; request id, job; no record)", a.unlike),
        promise("replays not audited (answers after the faults that replayed an earlier one)", a.unaudited_replays,
                f"{len(a.unaudited_replays)} of {a.known_replays} replays"),
        promise("arguments in the audit trail (an entry holding the load's marker)", a.with_arguments),
        ("audit rows' executions: in Redis's loss window",
         f"{len(a.in_loss_window)} of {len(a.named())} (finished, run or answered 1 s before a kill -9 or "
         "failover, or in a hang)",
         "info"),
    ]


def text(table: Table, title: str, log_errors: dict[str, int]) -> str:
    """The table in markdown, the process logs' error lines as its last row, and the verdict."""
    lines = [f"### {title}", "", "| | | |", "|---|---|---|"]
    lines += [f"| {name} | {value} | {verdict} |" for name, value, verdict in rows(table)]
    errors = sum(log_errors.values())
    common = "; ".join(f"{n}× {message}" for message, n in sorted(log_errors.items(), key=lambda kv: -kv[1])[:3])
    lines.append(f"| error lines in process logs | {errors}{f' ({common})' if common else ''} | info |")
    violations = table.violations()
    lines.append("")
    lines.append("PASS: the promise held" if not violations else
                 "FAIL: " + ", ".join(f"{name} {n}" for name, n in violations.items()))
    return "\n".join(lines)


def evidence(table: Table, requests: list[Request], ledger: list[LedgerLine],
             jobs: list[Job] | None = None, events: list[Event] | None = None,
             trail: Trail | None = None, streams: list[Stream] | None = None) -> dict[str, Any]:
    """Everything known of each request or job a violation names: its attempts (a job's creation
    and reads) and its ledger lines (a job's: every attempt's); of each execution the audit rows
    name, its entries, its record and its ledger lines; of each the streams' rows name, its
    stream and its record."""
    named = {rid for rids in (table.lost, table.duplicated_effects, table.flipped, table.unfounded,
                              table.false_uncertain, table.effects_after_verdict, table.hangs) for rid in rids}
    named |= {rid for pair in table.lock_overlaps for rid in pair.split("/")}
    by_rid = {r.rid: r for r in requests}
    found = {rid: {"request": msgspec.to_builtins(by_rid[rid]) if rid in by_rid else None,
                   "ledger": [msgspec.to_builtins(line) for line in ledger if line.rid == rid]}
             for rid in sorted(named)}
    by_job = {job.rid: job for job in jobs or []}
    for rid in sorted(table.jobs.named() if table.jobs else set()):
        found[rid] = {"job": msgspec.to_builtins(by_job[rid]) if rid in by_job else None,
                      "ledger": [msgspec.to_builtins(line) for line in ledger
                                 if line.rid == rid or line.rid.startswith(rid + "#")]}
    by_event = {event.eid: event for event in events or []}
    for eid in sorted(table.hooks.named() if table.hooks else set()):
        found[eid] = {"event": msgspec.to_builtins(by_event[eid]) if eid in by_event else None,
                      "ledger": [msgspec.to_builtins(line) for line in ledger
                                 if line.rid == eid or line.rid.startswith(eid + "#")]}
    if table.audit and trail:
        found |= audit_evidence(table.audit, trail, ledger)
    named = table.streams.named() if table.streams else set()
    for stream in streams or []:
        if stream.started in named:
            found[stream.started] = {"stream": msgspec.to_builtins(stream),
                                     "record": next((msgspec.to_builtins(r) for r in (trail.records if trail else [])
                                                     if r.xid == stream.started), None)}
    return found


def audit_evidence(audit: AuditTable, trail: Trail, ledger: list[LedgerLine]) -> dict[str, Any]:
    leaked = set(audit.with_arguments)
    named = audit.named() | {raw.fields.get("execution_id", "") for raw in trail.entries if raw.id in leaked}
    return {xid: {"entries": [msgspec.to_builtins(raw) for raw in trail.entries
                              if raw.fields.get("execution_id") == xid],
                  "record": next((msgspec.to_builtins(r) for r in trail.records if r.xid == xid), None),
                  "ledger": [msgspec.to_builtins(line) for line in ledger if line.xid == xid]}
            for xid in sorted(named)}


def as_json(table: Table, run: dict[str, Any], proof: dict[str, Any], log_errors: dict[str, int]) -> bytes:
    """The table (every list whole), the verdicts, how the run was made, and the evidence."""
    doc = {"run": run, "table": msgspec.to_builtins(table), "evidence": proof, "log_errors": log_errors,
           "rows": [{"row": n, "value": v, "verdict": d} for n, v, d in rows(table)],
           "violations": table.violations(),
           "detection_p50": percentile(table.detection, 50),
           "detection_max": max(table.detection) if table.detection else None}
    return msgspec.json.format(msgspec.json.encode(doc), indent=2)
