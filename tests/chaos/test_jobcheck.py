"""The chaos check's reconciliation of jobs, on made-up histories: each broken promise of jobs and
of the schedule is found, and a clean history passes. No processes: ``chaos.jobcheck`` is pure.

Times are small: a ledger line at ``t`` seconds, a job created at ``created_ms`` (Redis's ms).
"""

from __future__ import annotations

import json

from chaos.facts import Facts
from chaos.jobcheck import JobTable, reconcile_jobs
from chaos.model import Create, Fault, Job, JobRead, LedgerLine
from chaos.reconcile import Bounds, reconcile
from chaos.report import text
from tests.chaos.ledgers import run

IDEMPOTENT = {"job_put": True, "job_charge": False, "tick": False}
JOB_TOOLS = set(IDEMPOTENT)
TICK = "schedule:chaos-tick@1970-01-01T00:01:{:02d}.000Z"  # the occurrence at 60 + n seconds


def result(xid: str, pid: int, rid: str) -> str:
    body = {"execution_id": xid, "status": "completed", "data": {"pid": pid, "request_id": rid}}
    return json.dumps(body, sort_keys=True)


def seen(t: float, status: str | None, *executions: str, error: str | None = None, res: str | None = None,
         created_ms: int = 1000) -> JobRead:
    return JobRead(t=t, status=status, attempts=len(executions), executions=list(executions),
                   created_ms=created_ms, error=error, result=res)


def job(rid: str, tool: str, *reads: JobRead, delay_ms: int | None = 500, run_at: str | None = None,
        max_attempts: int = 3, ids: tuple[str, ...] = ("job_1",), fail: int = 0) -> Job:
    creates = [Create(t0=0.9, t1=1.0, api="a", http=202, job_id=job_id) for job_id in ids]
    return Job(rid=rid, tool=tool, args={"ms": 100, "fail": fail}, delay_ms=None if run_at else delay_ms,
               run_at=run_at, max_attempts=max_attempts, first=0.9, creates=creates, reads=list(reads))


def check(jobs: list[Job], ledger: list[LedgerLine], faults: list[Fault] | None = None, cutoff: float = 0.0,
          grace: float = 15.0) -> JobTable:
    return reconcile_jobs(jobs, ledger, Facts(ledger, faults or []), IDEMPOTENT, JOB_TOOLS, cutoff=cutoff,
                          grace=grace, backoff=(200, 1000))


def retried(rid: str = "j1") -> tuple[Job, list[LedgerLine]]:
    """A job due at 1.5 s whose first attempt failed on purpose, and whose second succeeded."""
    ledger = run(rid, "x1", "job_put", 10, 1.6, 1.7, ev="failed") + run(f"{rid}#2", "x2", "job_put", 11, 2.0, 2.1)
    done = seen(3.0, "succeeded", "x1", "x2", res=result("x2", 11, f"{rid}#2"))
    return job(rid, "job_put", seen(1.2, "queued"), done, seen(6.0, "succeeded", "x1", "x2",
                                                              res=result("x2", 11, f"{rid}#2")), fail=1), ledger


def test_a_clean_history_passes() -> None:
    put, ledger = retried()
    exhausted = job("j2", "job_charge", seen(5.0, "dead_lettered", "x3", "x4", error="CHAOS_FLAKY"),
                    run_at="1970-01-01T00:00:01.000+00:00", max_attempts=2, fail=9)
    ledger += run("j2", "x3", "job_charge", 10, 1.0, 1.1, ev="failed")
    ledger += run("j2#2", "x4", "job_charge", 10, 1.4, 1.5, ev="failed")
    ticks = [line for n in range(3) for line in run(TICK.format(n), f"t{n}", "tick", 10, 60.1 + n, 60.2 + n)]
    table = check([put, exhausted], ledger + ticks, cutoff=62.5)
    assert table.violations() == {}
    assert (table.jobs, table.delayed, table.attempts, table.occurrences) == (2, 1, 4, 3)
    assert table.statuses == {"dead_lettered": 1, "succeeded": 1}
    assert [round(x, 3) for x in table.lateness] == [0.0, 0.1]  # j2 was due at 1.0 s, j1 at 1.5 s


def test_a_job_not_finished_gone_or_created_twice_is_lost() -> None:
    waiting = job("j1", "job_put", seen(9.0, "running", "x1"))
    gone = job("j2", "job_put", seen(3.0, "succeeded", "x2", res=result("x2", 10, "j2")), seen(9.0, None))
    twice = job("j3", "job_put", seen(3.0, "succeeded", "x3", res=result("x3", 10, "j3")), ids=("job_3", "job_4"))
    nameless = job("j4", "job_put", ids=())  # its POST was never answered, yet it ran
    never = job("j5", "job_put", ids=())
    ledger = (run("j1", "x1", "job_put", 10, 2.0, None) + run("j2", "x2", "job_put", 10, 2.0, 2.1)
              + run("j3", "x3", "job_put", 10, 2.0, 2.1) + run("j4", "x4", "job_put", 10, 2.0, 2.1))
    table = check([waiting, gone, twice, nameless, never], ledger)
    assert table.lost == ["j1", "j2", "j3", "j4"]
    assert table.unanswered == 1


def test_an_attempt_run_by_two_executions_or_two_effects_of_a_non_idempotent_job_are_a_duplicate() -> None:
    put, ledger = retried("j1")
    ledger += run("j1#2", "x9", "job_put", 12, 2.0, 2.1)  # attempt 2 promoted twice
    charge = job("j2", "job_charge", seen(5.0, "succeeded", "x3", "x4", res=result("x4", 10, "j2#2")))
    ledger += run("j2", "x3", "job_charge", 10, 1.6, 1.7) + run("j2#2", "x4", "job_charge", 10, 2.0, 2.1)
    again = job("j3", "job_put", seen(5.0, "succeeded", "x5", res=result("x5", 11, "j3")))
    ledger += run("j3", "x5", "job_put", 10, 1.6, None) + run("j3", "x5", "job_put", 11, 4.0, 4.1)
    table = check([put, charge, again], ledger, [Fault(kind="worker-kill", t=2.0, t_end=2.5, target="w", pid=10)])
    assert table.run_twice == ["j1", "j2"]
    assert table.idempotent_reruns == 1  # j3: its worker died, its execution ran again: allowed


def test_a_run_before_the_job_was_due_is_early() -> None:
    delayed = job("j1", "job_put", seen(3.0, "succeeded", "x1", res=result("x1", 10, "j1")), delay_ms=500)
    timed = job("j2", "job_put", seen(3.0, "succeeded", "x2", res=result("x2", 10, "j2")),
                run_at="1970-01-01T00:00:02.000Z")
    # j1 was due at 1.5 s (created at 1.0 s, 500 ms later): 2 ms early is within the clocks' tolerance.
    ledger = run("j1", "x1", "job_put", 10, 1.498, 1.6) + run("j2", "x2", "job_put", 10, 1.9, 2.0)
    ledger += run(TICK.format(1), "t1", "tick", 10, 60.5, 60.6) + run(TICK.format(2), "t2", "tick", 10, 62.0, 62.1)
    # j3's attempt 2 came 150 ms after attempt 1 failed: its backoff is 200 ms at least. j4's
    # attempt 3 came 1.0 s after attempt 2 failed, the cap, although 200 ms · 2 = 400 ms would do.
    quick = job("j3", "job_put", seen(5.0, "succeeded", "x3", "x4", res=result("x4", 10, "j3#2")), fail=1)
    ledger += run("j3", "x3", "job_put", 10, 1.6, 1.7, ev="failed") + run("j3#2", "x4", "job_put", 10, 1.85, 1.9)
    patient = job("j4", "job_put", seen(5.0, "succeeded", "x5", "x6", "x7", res=result("x7", 10, "j4#3")), fail=2)
    ledger += (run("j4", "x5", "job_put", 10, 1.6, 1.7, ev="failed")
               + run("j4#2", "x6", "job_put", 10, 1.9, 2.0, ev="failed") + run("j4#3", "x7", "job_put", 10, 3.0, 3.1))
    table = check([delayed, timed, quick, patient], ledger, cutoff=62.0)
    assert table.early == ["j2", "j3", TICK.format(1)]


def test_a_non_idempotent_job_runs_no_attempt_after_an_uncertain_one() -> None:
    killed = Fault(kind="worker-kill", t=2.0, t_end=2.5, target="worker 10", pid=10)
    # j1: killed mid-run, dead-lettered as uncertain, never run again: right.
    good = job("j1", "job_charge", seen(5.0, "dead_lettered", "x1", error="EXECUTION_UNCERTAIN"))
    # j2: killed mid-run, then run again as attempt 2.
    rerun = job("j2", "job_charge", seen(5.0, "succeeded", "x2", "x3", res=result("x3", 11, "j2#2")))
    # j3: killed mid-run, and the job ended as if the attempt had failed on purpose.
    wrong_end = job("j3", "job_charge", seen(5.0, "dead_lettered", "x4", error="CHAOS_FLAKY"), max_attempts=1)
    # j4: attempt 1 failed on purpose before its effect: attempt 2 is what retries are for.
    fine = job("j4", "job_charge", seen(5.0, "succeeded", "x5", "x6", res=result("x6", 11, "j4#2")), fail=1)
    ledger = (run("j1", "x1", "job_charge", 10, 1.6, None) + run("j2", "x2", "job_charge", 10, 1.6, None)
              + run("j2#2", "x3", "job_charge", 11, 4.0, 4.1) + run("j3", "x4", "job_charge", 10, 1.6, None)
              + run("j4", "x5", "job_charge", 10, 1.6, 1.7, ev="failed") + run("j4#2", "x6", "job_charge", 11, 3, 3.1))
    table = check([good, rerun, wrong_end, fine], ledger, [killed])
    assert table.rerun_uncertain == ["j2", "j3"]
    assert (table.interrupted, table.uncertain_dead) == (3, 1)


def test_a_scheduled_occurrence_is_not_run_again_after_an_uncertain_attempt() -> None:
    ledger = run(TICK.format(0), "t1", "tick", 10, 60.1, 60.2, ev="abandoned") + run(
        TICK.format(0) + "#2", "t2", "tick", 11, 61.5, 61.6)
    assert check([], ledger, cutoff=60.0).rerun_uncertain == [TICK.format(0)]


def test_the_last_read_must_agree_with_the_runs() -> None:
    # j1: succeeded, but its result names a process that did no effect for it.
    other = job("j1", "job_put", seen(5.0, "succeeded", "x1", res=result("x1", 99, "j1")))
    # j2: attempt 2 ran, but the job shows one attempt.
    unlisted = job("j2", "job_put", seen(5.0, "succeeded", "x2", res=result("x2", 10, "j2")))
    # j3: dead-lettered with attempts left, for no uncertainty; j4: ended failed, which nothing asks for.
    early_dead = job("j3", "job_put", seen(5.0, "dead_lettered", "x4", error="CHAOS_FLAKY"), max_attempts=3)
    failed = job("j4", "job_put", seen(5.0, "failed", "x5", error="BAD"))
    # j5: its result is the first attempt's, not the last one's.
    stale = job("j5", "job_put", seen(5.0, "succeeded", "x6", "x7", res=result("x6", 10, "j5")))
    ledger = (run("j1", "x1", "job_put", 10, 1.6, 1.7) + run("j2", "x2", "job_put", 10, 1.6, 1.7)
              + run("j2#2", "x3", "job_put", 10, 2.6, 2.7) + run("j3", "x4", "job_put", 10, 1.6, 1.7, ev="failed")
              + run("j4", "x5", "job_put", 10, 1.6, 1.7, ev="failed") + run("j5", "x6", "job_put", 10, 1.6, 1.7)
              + run("j5#2", "x7", "job_put", 10, 2.6, 2.7))
    table = check([other, unlisted, early_dead, failed, stale], ledger)
    assert table.unlike_runs == ["j1", "j2", "j3", "j4", "j5"]


def test_a_read_unlike_an_earlier_finished_one_is_a_flip() -> None:
    put, ledger = retried("j1")
    flips = job("j2", "job_charge", seen(3.0, "succeeded", "x2", res=result("x2", 10, "j2")),
                seen(6.0, "dead_lettered", "x2", error="EXECUTION_UNCERTAIN"))
    ledger += run("j2", "x2", "job_charge", 10, 1.6, 1.7)
    table = check([put, flips], ledger)
    assert table.flipped == ["j2"]  # j1 went queued, then succeeded: no flip


def test_occurrences_fired_twice_or_missed_are_found_and_a_long_outage_excuses_a_skip() -> None:
    ledger = run(TICK.format(0), "t0", "tick", 10, 60.1, 60.2) + run(TICK.format(0), "t0b", "tick", 11, 60.1, 60.2)
    ledger += run(TICK.format(1), "t1", "tick", 10, 61.1, 61.2) + run(TICK.format(4), "t4", "tick", 10, 64.1, 64.2)
    ledger += run(TICK.format(20), "t20", "tick", 10, 80.1, 80.2)
    # Down from 65 s to 78 s, and 1 s more for the clients to reconnect (facts.REDIS_GRACE_S).
    down = Fault(kind="redis-kill", t=65.0, t_end=78.0, target="redis 1", pid=1)
    table = check([], ledger, [down], cutoff=80.5, grace=10.0)
    assert table.fired_twice == [TICK.format(0)]
    # 62 and 63 s were missed with Redis up; 65-69 s could not be fired within 10 s; 70-79 s could.
    assert table.missed == [f"1970-01-01T00:01:{s:02d}+00:00" for s in (2, 3, *range(10, 20))]
    assert table.excused == 5
    assert table.occurrences == 4


def test_the_jobs_rows_are_in_the_calls_table_and_its_verdict() -> None:
    put, ledger = retried("j1")
    lost = job("j2", "job_put", seen(9.0, "queued"))
    jobs = check([put, lost], ledger)
    table = reconcile([], ledger, [], IDEMPOTENT, set(), Bounds(), n_workers=2)
    table.jobs = jobs
    assert table.violations() == {"jobs lost": 1}
    shown = text(table, "t", {})
    assert "| jobs lost | 1 (e.g. j2) | VIOLATION |" in shown
    assert shown.endswith("FAIL: jobs lost 1")
