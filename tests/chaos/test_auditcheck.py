"""The chaos check's reconciliation of the audit trail, on made-up histories: each violation
caught, a clean history clean. No processes: ``chaos.auditcheck`` is pure."""

from __future__ import annotations

from chaos.auditcheck import AuditTable, reconcile_audit
from chaos.facts import Facts
from chaos.model import (
    ARGUMENT_MARK,
    Answer,
    Attempt,
    Create,
    Delivery,
    Event,
    Fault,
    Job,
    JobRead,
    LedgerLine,
    RawEntry,
    RecordSeen,
    Request,
    Trail,
)
from tests.chaos.ledgers import run

DONE = Answer(execution_id="x1", status="completed", code=None, data='{"pid":10}')


def entry(n: int, xid: str, *, rid: str = "r1", tool: str = "charge", status: str = "completed", code: str = "",
          job: str = "", replayed: bool = False, via: str = "http", **extra: str) -> RawEntry:
    """Entry ``n`` (written at ``1000 + n`` ms) as the LUA_AUDIT function writes one."""
    fields = {"execution_id": xid, "request_id": rid, "job_id": job, "principal": "", "tool": tool, "effect": "write",
              "status": status, "error_code": code, "duration_ms": "50", "queued_at": "900", "started_at": "950",
              "finished_at": str(1000 + n), "replayed": "1" if replayed else "", "via": via, "worker": "w1"}
    return RawEntry(id=f"{1000 + n}-0", fields=fields | extra)


def request(rid: str, answer: Answer, *, replayed_at: float | None = 5.0) -> Request:
    """A call answered at 1.1 s, and again (the final retry) at ``replayed_at``."""
    attempts = [Attempt(t0=1.0, t1=1.1, mode="sse", api="a", http=200, answer=answer)]
    if replayed_at is not None:
        attempts.append(Attempt(t0=replayed_at, t1=replayed_at + 0.1, mode="json", api="a", http=200, answer=answer,
                                phase="final"))
    return Request(rid=rid, tool="charge", args={"ms": 10}, first=1.0, attempts=attempts)


def clean() -> tuple[Trail, list[Request], list[Event], list[Job], list[LedgerLine]]:
    """A call answered then replayed, a webhook event answered then replayed, a job's two
    attempts (the first failing on purpose), and a tick still finishing while the end read."""
    answer2 = Answer(execution_id="x2", status="completed", code=None, data='{"pid":10}')
    hook = Event(eid="h1", hook="chaos-call", mode="call", body={}, first=1.0, deliveries=[
        Delivery(t0=1.0, t1=1.1, api="a", http=200, execution_id="x3", final=True),
        Delivery(t0=6.0, t1=6.1, api="a", http=200, execution_id="x3", final=True, phase="final")])
    job = Job(rid="j1", tool="job_put", args={"ms": 10, "fail": 1}, max_attempts=2, first=1.0,
              creates=[Create(t0=1.0, t1=1.1, api="a", http=202, job_id="job_a")],
              reads=[JobRead(t=9.0, status="succeeded", attempts=2, executions=["x4", "x5"])])
    ledger = (run("r1", "x1", "charge", 10, 1.0, 1.05) + run("r2", "x2", "charge", 10, 1.0, 1.05)
              + run("h1", "x3", "hook_charge", 10, 1.0, 1.05) + run("j1", "x4", "job_put", 10, 2.0, 2.1, ev="failed")
              + run("j1#2", "x5", "job_put", 10, 3.0, 3.1))
    entries = [entry(1, "x1"), entry(2, "x2", rid="r2"), entry(3, "x3", rid="h1", tool="hook_charge", via="webhook"),
               entry(4, "x4", rid="j1", tool="job_put", status="failed", code="CHAOS_FLAKY", job="job_a", via="job"),
               entry(5, "x5", rid="j1#2", tool="job_put", job="job_a", via="job"),
               entry(6, "x1", replayed=True), entry(7, "x2", rid="r2", replayed=True),
               entry(8, "x3", rid="h1", tool="hook_charge", via="webhook", replayed=True),
               entry(9, "x6", rid="schedule:chaos-tick@t", tool="tick", via="job")]  # finished as the end read
    records = [RecordSeen(xid="x1", tool="charge", status="completed"),
               RecordSeen(xid="x2", tool="charge", status="completed"),
               RecordSeen(xid="x3", tool="hook_charge", status="completed"),
               RecordSeen(xid="x4", tool="job_put", status="failed", error_code="CHAOS_FLAKY"),
               RecordSeen(xid="x5", tool="job_put", status="completed")]
    trail = Trail(records=records, entries=entries, before="1008-0", added=len(entries))
    return trail, [request("r1", DONE), request("r2", answer2)], [hook], [job], ledger


def check(trail: Trail, requests: list[Request], events: list[Event] | None = None, jobs: list[Job] | None = None,
          ledger: list[LedgerLine] | None = None, faults: list[Fault] | None = None) -> AuditTable:
    lines = ledger or []
    return reconcile_audit(trail, requests, events or [], jobs or [], lines, Facts(lines, faults or []))


def test_a_clean_history_is_clean() -> None:
    table = check(*clean())
    assert table.violations() == {}
    assert (table.entries, table.replayed, table.records, table.trimmed) == (9, 3, 5, 0)
    assert table.by_via == {"http": 4, "job": 3, "webhook": 2}
    assert table.known_replays == 3


def test_a_record_without_its_entry_is_caught_and_said_answered() -> None:
    trail, requests, events, jobs, ledger = clean()
    trail.entries = [e for e in trail.entries if not (e.fields["execution_id"] == "x1" and not e.fields["replayed"])]
    table = check(trail, requests, events, jobs, ledger)
    assert table.unaudited == ["x1"]
    assert table.unaudited_answered == 1


def test_an_execution_with_only_a_replayed_entry_is_unaudited() -> None:
    trail = clean()[0]
    trail.records = [RecordSeen(xid="x9", tool="charge", status="completed")]
    trail.entries = [entry(1, "x9", replayed=True)]
    assert check(trail, []).unaudited == ["x9"]


def test_two_entries_of_one_execution_are_caught_but_a_replay_is_not_one() -> None:
    trail, requests, events, jobs, ledger = clean()
    trail.entries.append(entry(10, "x1"))
    table = check(trail, requests, events, jobs, ledger)
    assert table.twice == ["x1"]
    assert "executions audited twice" in table.violations()


def test_an_entry_unlike_its_record_is_caught() -> None:
    for wrong in (entry(1, "x1", status="failed"), entry(1, "x1", tool="put"), entry(1, "x1", code="TOOL_TIMEOUT")):
        trail, requests, events, jobs, ledger = clean()
        trail.entries[0] = wrong
        assert check(trail, requests, events, jobs, ledger).unlike == ["x1"], wrong


def test_a_replay_unlike_its_record_is_caught() -> None:
    trail, requests, events, jobs, ledger = clean()
    trail.entries[5] = entry(6, "x1", status="failed", code="EXECUTION_UNCERTAIN", replayed=True)
    assert check(trail, requests, events, jobs, ledger).unlike == ["x1"]


def test_an_entry_naming_another_request_or_job_is_caught() -> None:
    trail, requests, events, jobs, ledger = clean()
    trail.entries[0] = entry(1, "x1", rid="r2")
    trail.entries[4] = entry(5, "x5", rid="j1#2", tool="job_put", job="job_b", via="job")
    assert check(trail, requests, events, jobs, ledger).unlike == ["x1", "x5"]


def test_an_entry_without_a_record_is_caught_unless_written_after_the_records_were_read() -> None:
    trail, requests, events, jobs, ledger = clean()
    trail.records = [r for r in trail.records if r.xid != "x2"]
    trail.entries.append(entry(20, "x7", rid="r7"))  # after ``before``: its record may not have been seen
    table = check(trail, requests, events, jobs, ledger)
    assert table.unlike == ["x2"]


def test_a_known_replay_without_its_replayed_entry_is_caught() -> None:
    trail, requests, events, jobs, ledger = clean()
    trail.entries = [e for e in trail.entries
                     if not (e.fields["replayed"] and e.fields["execution_id"] in ("x1", "x3"))]
    assert check(trail, requests, events, jobs, ledger).unaudited_replays == ["x1", "x3"]


def test_a_replayed_entry_by_another_door_is_not_the_replay() -> None:
    trail, requests, events, jobs, ledger = clean()
    trail.entries[5] = entry(6, "x1", replayed=True, via="sse")  # the final retry was plain JSON
    assert check(trail, requests, events, jobs, ledger).unaudited_replays == ["x1"]


def test_only_answers_after_the_faults_that_repeat_an_earlier_one_are_known_replays() -> None:
    flipped = Answer(execution_id="x1", status="completed", code="EXECUTION_UNCERTAIN", data=None)
    early = request("r1", DONE, replayed_at=None)
    early.attempts.append(Attempt(t0=2.0, t1=2.1, mode="json", api="a", http=200, answer=DONE))  # during the faults
    changed = request("r1", DONE)
    changed.attempts[1].answer = flipped  # the record was lost and settled again: the calls' rows count it
    racing = request("r1", DONE, replayed_at=1.05)  # asked for before the first answer came
    trail = Trail(records=[RecordSeen(xid="x1", tool="charge", status="completed")], entries=[entry(1, "x1")],
                  before="1001-0", added=1)
    for history in (early, changed, racing):
        table = check(trail, [history])
        assert (table.known_replays, table.unaudited_replays) == (0, [])


def test_an_entry_holding_the_argument_marker_is_caught_in_any_field() -> None:
    trail, requests, events, jobs, ledger = clean()
    trail.entries[0] = entry(1, "x1", arguments='{"ms":10,"mark":"' + ARGUMENT_MARK + '"}')
    trail.entries[1] = entry(2, "x2", rid="r2", **{ARGUMENT_MARK: "1"})
    assert check(trail, requests, events, jobs, ledger).with_arguments == ["1001-0", "1002-0"]


def test_trimmed_entries_are_counted() -> None:
    trail, requests, events, jobs, ledger = clean()
    trail.added += 4
    assert check(trail, requests, events, jobs, ledger).trimmed == 4


def test_the_loss_window_names_executions_finished_just_before_a_redis_crash() -> None:
    trail, requests, events, jobs, ledger = clean()
    trail.entries.append(entry(10, "x1"))  # finished at 1.010 s
    crash = Fault(kind="redis-kill", t=1.5, t_end=3.0, target="redis 1", pid=1)
    table = check(trail, requests, events, jobs, ledger, [crash])
    assert (table.twice, table.in_loss_window) == (["x1"], ["x1"])
    assert "executions audited twice" in table.violations()  # still a violation: info beside it
