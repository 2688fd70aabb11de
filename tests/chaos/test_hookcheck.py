"""The chaos check's reconciliation of webhooks in and callbacks out, on made-up histories, and
what a sender signs. No processes: ``chaos.hookcheck`` is pure."""

from __future__ import annotations

import hashlib
import hmac
import random

from standardwebhooks import Webhook, WebhookVerificationError

from chaos.hookcheck import HookTable, reconcile_hooks
from chaos.hookload import Secrets, new_event, signed
from chaos.model import Callback, Create, Delivery, Event, Job, JobRead
from tests.chaos.ledgers import run

TOOLS = {"hook_charge", "hook_job"}


def event(eid: str, mode: str, *deliveries: Delivery, forged: str | None = None) -> Event:
    body = {"id": eid, "args": {"ms": 10}} if mode == "call" else {"ms": 10}
    return Event(eid=eid, hook=f"chaos-{mode}", mode="call" if mode == "call" else "job", body=body, forged=forged,
                 first=0.0, deliveries=list(deliveries))


def answer(xid: str | None = None, job_id: str | None = None, http: int = 200, code: str | None = None) -> Delivery:
    return Delivery(t0=1.0, t1=1.1, api="a", http=http, code=code, execution_id=xid, job_id=job_id,
                    final=xid is not None)


def job(rid: str, job_id: str, status: str | None, notify: str | None = "delivered") -> Job:
    return Job(rid=rid, tool="job_put", args={"ms": 10, "fail": 0}, max_attempts=2, first=0.0, notify="http://r/",
               creates=[Create(t0=0.0, t1=0.1, api="a", http=202, job_id=job_id)],
               reads=[JobRead(t=5.0, status=status, attempts=1, notify=notify)])


def callback(job_id: str, status: str = "succeeded", verified: bool = True, answered: int = 204,
             webhook_id: str | None = None) -> Callback:
    return Callback(t=4.0, webhook_id=webhook_id or f"msg_{job_id}_{status}_1", verified=verified, job_id=job_id,
                    status=status, attempts=1, answered=answered)


def check(events: list[Event], ledger: list | None = None, jobs: list[Job] | None = None,
          callbacks: list[Callback] | None = None) -> HookTable:
    return reconcile_hooks(events, ledger or [], TOOLS, jobs or [], callbacks or [])


def clean() -> tuple[list[Event], list, list[Job], list[Callback]]:
    events = [
        event("h1", "call", Delivery(t0=0.5, t1=0.6, api="a", http=503, code="STORE_UNAVAILABLE"),
              answer("x1"), answer("x1")),  # retried through an outage, then redelivered: replayed
        event("h2", "job", answer(job_id="job_1", http=202), answer(job_id="job_1")),
        event("h3", "call", answer(http=401, code="WEBHOOK_UNAUTHORIZED"), forged="tampered"),
        event("h4", "job", Delivery(t0=1.0, t1=1.1, api="a", error="ConnectError"),
              answer(http=401, code="WEBHOOK_UNAUTHORIZED"), forged="unsigned"),
    ]
    ledger = run("h1", "x1", "hook_charge", 10, 1.0, 1.05) + run("h2", "x2", "hook_job", 10, 1.0, 1.05)
    jobs = [job("j1", "job_a", "succeeded"), job("j2", "job_b", "dead_lettered")]
    callbacks = [callback("job_a", answered=500), callback("job_a"), callback("job_b", "dead_lettered")]
    return events, ledger, jobs, callbacks


def test_a_clean_history_passes() -> None:
    events, ledger, jobs, callbacks = clean()
    table = check(events, ledger, jobs, callbacks)
    assert table.violations() == {}
    assert (table.events, table.calls, table.forged, table.redelivered) == (4, 2, 2, 2)
    assert (table.notify_jobs, table.callbacks, table.refused, table.repeats) == (2, 3, 1, 1)
    assert table.answers == {"-": 1, "200": 3, "202": 1, "401": 2, "503": 1}


def test_an_event_run_twice_or_answered_by_two_runs_is_found() -> None:
    events = [event("h1", "call", answer("x1"), answer("x2")), event("h2", "job", answer(job_id="job_1")),
              event("h3", "call", Delivery(t0=1.0, t1=1.1, api="a", error="ReadTimeout"))]
    ledger = (run("h1", "x1", "hook_charge", 10, 1.0, 1.1) + run("h1", "x2", "hook_charge", 11, 2.0, 2.1)
              + run("h2", "x3", "hook_job", 10, 1.0, 1.1) + run("h2#2", "x4", "hook_job", 10, 2.0, 2.1))
    table = check(events, ledger)
    assert table.run_twice == ["h1", "h2"]  # two executions; a non-idempotent job's effect twice
    assert table.not_replayed == ["h1", "h3"]  # two execution ids; never answered


def test_a_forged_delivery_that_ran_or_was_not_refused_is_found() -> None:
    events = [event("h1", "call", answer(http=401, code="WEBHOOK_UNAUTHORIZED"), forged="wrong-secret"),
              event("h2", "job", answer(job_id="job_1", http=202), forged="tampered")]
    ledger = run("h1", "x1", "hook_charge", 10, 1.0, 1.1) + run("h9", "x9", "hook_job", 10, 1.0, 1.1)
    assert check(events, ledger).forged_ran == ["h1", "h2", "h9"]  # ran; answered 202; a run of no true event


def test_answers_other_than_documented_are_found() -> None:
    ok = event("h1", "call", answer(http=503, code="NO_WORKERS"), answer(http=404, code="TOOL_NOT_FOUND"),
               answer("x1", http=500, code="EXECUTION_UNCERTAIN"))  # a result body is a documented answer
    unauthorized = event("h2", "job", answer(http=401, code="WEBHOOK_UNAUTHORIZED"), answer(job_id="job_1"))
    crashed = event("h3", "call", answer(http=500, code="INTERNAL"), answer("x3"))
    conflict = event("h4", "job", answer(http=409, code="IDEMPOTENCY_CONFLICT"), answer(job_id="job_4"))
    assert check([ok, unauthorized, crashed, conflict]).undocumented == ["h2", "h3", "h4"]


def test_callbacks_lost_forged_unstable_or_not_shown_are_found() -> None:
    jobs = [job("j1", "job_a", "succeeded"), job("j2", "job_b", "succeeded"), job("j3", "job_c", "succeeded"),
            job("j4", "job_d", "succeeded", notify="pending"), job("j5", "job_e", "running", notify="waiting")]
    callbacks = [
        callback("job_a", answered=500),  # its only delivery was refused: it still reached the receiver
        callback("job_b", "dead_lettered"),  # of another status than the job's: lost
        callback("job_c"), callback("job_c", webhook_id="msg_other"),
        callback("job_d"),
        callback("job_a", verified=False), callback("job_z"),
    ]
    table = check([], [], jobs, callbacks)
    assert table.callbacks_lost == ["j2"]
    assert table.callbacks_forged == ["msg_job_a_succeeded_1", "msg_job_z_succeeded_1"]
    assert table.unstable_ids == ["j3"]
    assert table.not_shown == ["j4"]
    assert table.notify_jobs == 4  # the running one is the jobs' rows' business


def test_a_sender_signs_true_events_and_never_forged_ones() -> None:
    secrets = Secrets()
    rng = random.Random(3)
    events = [new_event(rng, f"h{i}") for i in range(300)]
    assert {e.forged for e in events} == {None, "tampered", "unsigned", "wrong-secret"}
    for e in events:
        body, headers = signed(e, secrets)
        assert verifies(secrets, e.mode, body, headers) == (e.forged is None), e


def verifies(secrets: Secrets, mode: str, body: bytes, headers: dict[str, str]) -> bool:
    if mode == "call":
        expected = "sha256=" + hmac.new(secrets.hmac.encode(), body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(headers.get("X-Hub-Signature-256", ""), expected)
    try:
        Webhook(secrets.standard).verify(body, headers)
    except WebhookVerificationError:
        return False
    return True
