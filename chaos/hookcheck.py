"""The reconciliation of webhooks: deliveries in (``Event``: what the API answered each delivery)
against the ledger, and callbacks out (``Callback``: what the receiver got) against the jobs that
asked for them. Pure functions, as ``chaos.jobcheck`` is.

Definitions (each a violation):

* **run twice**: a true event whose tool ran under its event id by two executions (an attempt of
  its job too, ``{event id}#n``), or did its effect twice (both webhook tools are not idempotent).
* **lost or not replayed**: a true event answered with two execution ids (mode ``call``) or two
  job ids (mode ``job``), or with none at all by the end (every true event is delivered again
  once the faults have stopped).
* **forged, run or answered**: a forged event whose id is in the ledger (or any webhook tool's
  run under an id no true event has), or a forged delivery answered other than
  ``401 WEBHOOK_UNAUTHORIZED``.
* **answers not as documented**: a true delivery answered ``401``, a ``5xx`` that is neither a
  ``503`` with a code a retry cures (``STORE_UNAVAILABLE``, ``NO_WORKERS``, …) nor a call's result
  body, or any other refusal (``400``, ``409``, …: the sender sent the same body each time).
* **callbacks lost**: a finished job that asked for a callback with no verified delivery of its
  final status.
* **callbacks forged**: a delivery the ``standardwebhooks`` library did not verify, or naming no
  job that asked for one.
* **callback ids unstable**: one job's callback under two ``webhook-id``s, or one that is not
  ``msg_<job_id>_<status>_<attempts>``.
* **callbacks not shown delivered**: the job's last read does not say ``delivered``.
"""

from __future__ import annotations

from collections import defaultdict

from msgspec import Struct

from chaos.calls import RETRY_CODES
from chaos.jobcheck import FINISHED, ran_twice
from chaos.model import Callback, Event, Job, LedgerLine, attempt_of
from chaos.receiver import HUNG

UNAUTHORIZED = "WEBHOOK_UNAUTHORIZED"


class HookTable(Struct, kw_only=True):
    """The webhooks' findings. Lists hold event ids (webhook ids, job request ids for callbacks)."""

    events: int
    calls: int  # events of the webhook in mode call (the others: mode job)
    forged: int
    deliveries: int
    redelivered: int  # true events answered more than once
    answers: dict[str, int]  # HTTP status of every delivery ("-": none)
    run_twice: list[str]
    not_replayed: list[str]
    forged_ran: list[str]
    undocumented: list[str]
    notify_jobs: int  # finished jobs that asked for a callback
    callbacks: int  # deliveries the receiver got
    refused: int  # of them, answered 500 on purpose
    hung: int  # of them, left unanswered past the worker's timeout on purpose
    repeats: int  # deliveries of a callback after its first
    callbacks_lost: list[str]
    callbacks_forged: list[str]
    unstable_ids: list[str]
    not_shown: list[str]

    def violations(self) -> dict[str, int]:
        found = {"webhook events run twice": len(self.run_twice), "webhook events not replayed": len(self.not_replayed),
                 "forged deliveries run or not refused": len(self.forged_ran),
                 "webhook answers not as documented": len(self.undocumented),
                 "callbacks lost": len(self.callbacks_lost), "callbacks forged": len(self.callbacks_forged),
                 "callback ids unstable": len(self.unstable_ids),
                 "callbacks not shown delivered": len(self.not_shown)}
        return {name: n for name, n in found.items() if n}

    def named(self) -> set[str]:
        """The event ids the webhook rows name (the callbacks' rows name jobs and webhook ids)."""
        return {eid for eids in (self.run_twice, self.not_replayed, self.forged_ran, self.undocumented) for eid in eids}


def hook_runs(ledger: list[LedgerLine], tools: set[str]) -> dict[str, list[LedgerLine]]:
    """The webhook tools' lines, by event id (a job's attempts under their job's)."""
    found: dict[str, list[LedgerLine]] = defaultdict(list)
    for line in ledger:
        if line.tool in tools:
            found[attempt_of(line.rid)[0]].append(line)
    return found


def not_replayed(event: Event) -> bool:
    ids = {d.execution_id for d in event.deliveries if d.final} | {d.job_id for d in event.deliveries if d.job_id}
    return len(ids) != 1


def forged_answered(event: Event) -> bool:
    return any(d.http is not None and (d.http, d.code) != (401, UNAUTHORIZED) for d in event.deliveries)


def undocumented(event: Event) -> bool:
    for d in event.deliveries:
        if d.http is None or d.final or d.job_id is not None:
            continue
        if (d.http, d.code in RETRY_CODES) == (503, True) or (d.http, d.code) == (404, "TOOL_NOT_FOUND"):
            continue
        return True  # a 401, another 5xx, or a refusal the same body should never get
    return False


def reconcile_hooks(events: list[Event], ledger: list[LedgerLine], tools: set[str], jobs: list[Job],
                    callbacks: list[Callback]) -> HookTable:
    """The rows of both: ``tools`` are the webhooks' tools, ``jobs`` every job of the load."""
    runs = hook_runs(ledger, tools)
    true = [event for event in events if event.forged is None]
    known = {event.eid for event in true}
    table = HookTable(
        events=len(events), calls=sum(event.mode == "call" for event in events),
        forged=len(events) - len(true), deliveries=sum(len(event.deliveries) for event in events),
        redelivered=sum(sum(d.final or d.job_id is not None for d in event.deliveries) > 1 for event in true),
        answers=answer_counts(events),
        run_twice=[event.eid for event in true if ran_twice(runs.get(event.eid, []), idempotent=False)],
        not_replayed=[event.eid for event in true if not_replayed(event)],
        forged_ran=sorted({event.eid for event in events if event.forged is not None and forged_answered(event)}
                          | {eid for eid in runs if eid not in known}),
        undocumented=[event.eid for event in true if undocumented(event)],
        notify_jobs=0, callbacks=len(callbacks), refused=sum(c.answered >= 500 for c in callbacks),
        hung=sum(c.answered == HUNG for c in callbacks),
        repeats=len(callbacks) - len({c.webhook_id for c in callbacks}),
        callbacks_lost=[], callbacks_forged=[], unstable_ids=[], not_shown=[])
    check_callbacks(table, jobs, callbacks)
    return table


def answer_counts(events: list[Event]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for event in events:
        for d in event.deliveries:
            counts["-" if d.http is None else str(d.http)] += 1
    return dict(sorted(counts.items()))


def check_callbacks(table: HookTable, jobs: list[Job], callbacks: list[Callback]) -> None:
    """Fills the callbacks' rows of ``table``."""
    asked = {job_id: job for job in jobs if job.notify is not None for job_id in job.job_ids()}
    by_job: dict[str, list[Callback]] = defaultdict(list)
    for callback in callbacks:
        if callback.verified and callback.job_id in asked:
            by_job[callback.job_id].append(callback)
    done = [(job_id, job) for job_id, job in sorted(asked.items()) if job.reads and job.reads[-1].status in FINISHED]
    table.notify_jobs = len(done)
    for job_id, job in done:
        got, last = by_job.get(job_id, []), job.reads[-1]
        if not any(c.status == last.status for c in got):
            table.callbacks_lost.append(job.rid)
        if len({c.webhook_id for c in got}) > 1 or any(
                c.webhook_id != f"msg_{job_id}_{c.status}_{c.attempts}" for c in got):
            table.unstable_ids.append(job.rid)
        if last.notify != "delivered":
            table.not_shown.append(job.rid)
    table.callbacks_forged = [c.webhook_id or "(no webhook-id)" for c in callbacks
                              if not c.verified or c.job_id not in asked]
