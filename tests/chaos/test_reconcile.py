"""The chaos check's reconciliation, on made-up histories: each broken promise is found, and a
clean history passes. No processes: ``chaos.reconcile`` is pure."""

from __future__ import annotations

from chaos.model import Answer, Attempt, Fault, LedgerLine, Request
from chaos.reconcile import Bounds, Table, reconcile
from tests.chaos.ledgers import run

IDEMPOTENT = {"charge": False, "put": True, "serial": False}
EXCLUSIVE = {"serial"}
BOUNDS = Bounds(patience=30, slow=10, after_verdict=1)


def ok(xid: str, t: float, data: str = '{"pid":1}') -> Attempt:
    return Attempt(t0=t - 0.1, t1=t, mode="json", api="a", http=200,
                   answer=Answer(execution_id=xid, status="completed", code=None, data=data))


def uncertain(xid: str, t: float) -> Attempt:
    return Attempt(t0=t - 0.1, t1=t, mode="json", api="a", http=409, code="EXECUTION_UNCERTAIN",
                   answer=Answer(execution_id=xid, status="failed", code="EXECUTION_UNCERTAIN", data=None))


def refused(code: str, t: float) -> Attempt:
    return Attempt(t0=t - 0.1, t1=t, mode="json", api="a", http=503, code=code)


def check(requests: list[Request], ledger: list[LedgerLine], faults: list[Fault] | None = None) -> Table:
    return reconcile(requests, ledger, faults or [], IDEMPOTENT, EXCLUSIVE, BOUNDS, n_workers=2)


def request(rid: str, tool: str, *attempts: Attempt, first: float = 0.0) -> Request:
    return Request(rid=rid, tool=tool, args={"ms": 1}, first=first, attempts=list(attempts))


def test_a_clean_history_passes() -> None:
    table = check([request("r1", "charge", refused("STORE_UNAVAILABLE", 0.5), ok("x1", 2.0)),
                   request("r2", "put", ok("x2", 1.0), ok("x2", 50.0))],
                  run("r1", "x1", "charge", 1, 1.0, 1.5) + run("r2", "x2", "put", 1, 0.2, 0.8))
    assert table.violations() == {}
    assert (table.requests, table.answered, table.attempts) == (2, 2, 4)
    assert table.false_store_unavailable == [0.4]  # no Redis fault was injected


def test_a_non_idempotent_effect_twice_is_a_duplicate_and_an_idempotent_one_is_not() -> None:
    ledger = (run("r1", "x1", "charge", 10, 1.0, 1.5) + run("r1", "x1", "charge", 11, 5.0, 5.5)
              + run("r2", "x2", "put", 10, 1.0, 1.5) + run("r2", "x2", "put", 11, 5.0, 5.5))
    table = check([request("r1", "charge", ok("x1", 6.0)), request("r2", "put", ok("x2", 6.0))], ledger)
    assert table.duplicated_effects == ["r1"]
    assert table.idempotent_reruns == 1 and table.double_starts == 1


def test_two_different_answers_are_a_flip() -> None:
    table = check([request("r1", "put", ok("x1", 1.0, '{"pid":1}'), ok("x1", 9.0, '{"pid":2}'))],
                  run("r1", "x1", "put", 1, 0.1, 0.5))
    assert table.flipped == ["r1"]


def test_a_completed_answer_needs_the_effect_of_the_run_it_names() -> None:
    ledger = (run("r1", "x1", "put", 1, 0.1, 0.5) + run("r2", "x2", "put", 1, 0.1, 0.5, ev="abandoned")
              + run("r3", "x3", "put", 1, 0.1, 0.5))
    table = check([request("r1", "put", ok("x1", 1.0, '{"pid":2}')), request("r2", "put", ok("x2", 1.0)),
                   request("r3", "put", ok("x3", 1.0))], ledger)
    assert table.unfounded == ["r1", "r2"]  # another process's effect; no effect at all


def test_a_second_execution_for_one_request_is_a_lost_record() -> None:
    # The first execution ran; its record vanished, and the retry started another one.
    ledger = run("r1", "x1", "put", 1, 0.1, 0.5) + run("r1", "x2", "put", 1, 3.0, 3.2)
    table = check([request("r1", "put", ok("x2", 3.3))], ledger)
    assert table.lost == ["r1"]


def test_an_accepted_call_never_answered_is_lost_and_a_hang() -> None:
    accepted = Attempt(t0=0, t1=1, mode="async", api="a", http=202, execution_id="x1")
    table = check([request("r1", "put", accepted, refused("STORE_UNAVAILABLE", 40))], [])
    assert table.lost == ["r1"] and table.hangs == ["r1"]


def test_an_execution_a_get_no_longer_knows_is_lost() -> None:
    gone = Attempt(t0=0, t1=1, mode="async", api="a", http=404, execution_id="x1", gone=True)
    table = check([request("r1", "put", gone, ok("x1", 2))], run("r1", "x1", "put", 1, 0.1, 0.5))
    assert table.lost == ["r1"]


def test_an_answer_past_the_patience_is_a_hang_and_a_slow_one_is_not() -> None:
    table = check([request("r1", "put", ok("x1", 31.0)), request("r2", "put", ok("x2", 12.0))],
                  run("r1", "x1", "put", 1, 0.1, 0.5) + run("r2", "x2", "put", 1, 0.1, 0.5))
    assert table.hangs == ["r1"] and table.slow == 1


def test_uncertain_after_an_effect_on_a_live_worker_is_false() -> None:
    table = check([request("r1", "charge", uncertain("x1", 5.0))], run("r1", "x1", "charge", 10, 1.0, 1.5))
    assert table.false_uncertain == ["r1"] and table.uncertain == 1


def test_uncertain_for_a_tool_that_never_started_is_counted_apart() -> None:
    table = check([request("r1", "charge", uncertain("x1", 5.0))], [])
    assert (table.uncertain, table.uncertain_unstarted, table.false_uncertain) == (1, 1, [])


def test_uncertain_after_the_worker_was_killed_or_paused_is_true() -> None:
    killed = Fault(kind="worker-kill", t=2.0, t_end=3.0, target="worker 10", pid=10)
    paused = Fault(kind="worker-stop", t=2.0, t_end=9.0, target="worker 11", pid=11)
    ledger = run("r1", "x1", "charge", 10, 1.0, 1.5) + run("r2", "x2", "charge", 11, 1.0, 1.5)
    table = check([request("r1", "charge", uncertain("x1", 5.0)), request("r2", "charge", uncertain("x2", 5.0))],
                  ledger, [killed, paused])
    assert table.false_uncertain == [] and table.uncertain_after_pause == 1


def test_an_effect_long_after_the_verdict_is_a_violation() -> None:
    paused = Fault(kind="worker-stop", t=1.2, t_end=9.0, target="worker 10", pid=10)
    ledger = run("r1", "x1", "charge", 10, 1.0, 9.0) + run("r2", "x2", "charge", 10, 1.0, 5.5)
    table = check([request("r1", "charge", uncertain("x1", 5.0)), request("r2", "charge", uncertain("x2", 5.0))],
                  ledger, [paused])
    assert table.effects_after_verdict == ["r1"]  # 4 s late; r2's 0.5 s is within the bound
    assert table.after_verdict_delays == [0.5, 4.0]
    assert table.false_uncertain == []


def test_overlapping_runs_of_a_parallel_unsafe_tool_are_found() -> None:
    killed = Fault(kind="worker-kill", t=6.0, t_end=7.0, target="worker 12", pid=12)
    ledger = (run("r1", "x1", "serial", 10, 1.0, 2.0) + run("r2", "x2", "serial", 11, 1.5, 2.5, ev="abandoned")
              + run("r3", "x3", "serial", 12, 3.0, None) + run("r4", "x4", "serial", 10, 5.0, 5.1)
              + run("r5", "x5", "serial", 10, 7.0, 7.1) + run("r6", "x6", "put", 11, 7.0, 7.1))
    requests = [request(f"r{i}", "serial", ok(f"x{i}", 8.0)) for i in range(1, 6)]
    table = check(requests, ledger, [killed])
    # r3 never ended: its run lasts until its worker was killed, over r4's.
    assert table.lock_overlaps == ["r1/r2", "r3/r4"]


def test_a_run_frozen_by_a_pause_and_then_abandoned_ends_where_the_pause_began() -> None:
    paused = Fault(kind="worker-stop", t=1.1, t_end=7.0, target="worker 10", pid=10)
    ledger = (run("r1", "x1", "serial", 10, 1.0, 7.2, ev="abandoned") + run("r2", "x2", "serial", 11, 6.1, 6.2)
              + run("r3", "x3", "serial", 10, 8.0, 8.05) + run("r4", "x4", "serial", 12, 7.9, 11.0, ev="abandoned")
              + run("r5", "x5", "serial", 11, 10.0, 10.1))
    requests = [request(f"r{i}", "serial", ok(f"x{i}", 12.0)) for i in range(1, 6)]
    table = check(requests, ledger, [paused])
    # r4 was never paused: abandoned or not, it ran alongside r3 and r5.
    assert table.lock_overlaps == ["r4/r3", "r4/r5"]


def test_detection_time_runs_from_the_kill_to_the_answer_or_the_rerun() -> None:
    killed = Fault(kind="worker-kill", t=10.0, t_end=11.0, target="worker 10", pid=10)
    ledger = (run("r1", "x1", "charge", 10, 9.0, None) + run("r2", "x2", "put", 10, 9.5, None)
              + run("r2", "x2", "put", 11, 12.5, 12.6) + run("r3", "x3", "put", 10, 8.0, 8.5))
    requests = [request("r1", "charge", uncertain("x1", 13.0)), request("r2", "put", ok("x2", 12.7)),
                request("r3", "put", ok("x3", 8.6))]
    table = check(requests, ledger, [killed])
    assert sorted(table.detection) == [2.5, 3.0]  # r3 had finished before the kill


def test_refusals_are_false_only_outside_their_cause() -> None:
    down = Fault(kind="redis-kill", t=10.0, t_end=12.0, target="redis 1", pid=1)
    paused = Fault(kind="worker-stop", t=20.0, t_end=25.0, target="worker 2", pid=2)
    attempts = [refused("STORE_UNAVAILABLE", 11.0), refused("STORE_UNAVAILABLE", 12.5),
                refused("STORE_UNAVAILABLE", 20.0), refused("NO_WORKERS", 21.0), ok("x1", 30.0)]
    table = check([request("r1", "put", *attempts)], run("r1", "x1", "put", 3, 29, 29.5), [down, paused])
    # 12.5 is within the grace after Redis came back; one worker of two was out at 21.0.
    assert (table.false_store_unavailable, table.false_no_workers) == ([19.9], [20.9])


def test_a_failover_is_an_outage_until_the_promotion() -> None:
    failover = Fault(kind="redis-failover", t=10.0, t_end=20.0, target="redis 1", pid=1, promoted=12.0)
    attempts = [refused("STORE_UNAVAILABLE", 11.0), refused("STORE_UNAVAILABLE", 12.8),
                refused("STORE_UNAVAILABLE", 15.0), ok("x1", 30.0)]
    table = check([request("r1", "put", *attempts)], run("r1", "x1", "put", 3, 29, 29.5), [failover])
    # The old primary's return as a replica (t_end) is no outage: only the promotion (+ grace) is.
    assert table.false_store_unavailable == [14.9]
    assert table.faults == {"redis-failover": 1}


def test_a_hang_is_a_loss_window_until_the_hung_primary_woke_not_until_its_replica_was_promoted() -> None:
    # Held 6 s past the promotion (chaos.faults.HANG_HOLD_S): what was sent to it runs when it
    # wakes, before it learns it was replaced, and is dropped with its writes.
    hang = Fault(kind="cluster-hang", t=10.0, t_end=24.0, target="redis 1", pid=1, promoted=15.0, woke=21.0)
    requests = [request("r1", "put", ok("x1", 19.0), uncertain("x1", 30.0)),
                request("r2", "put", ok("x2", 23.0), uncertain("x2", 35.0))]
    ledger = run("r1", "x1", "put", 3, 18.0, 18.2) + run("r2", "x2", "put", 3, 22.8, 22.9)
    table = check(requests, ledger, [hang])
    assert table.flipped == ["r1", "r2"]
    assert table.in_loss_window == ["r1"]  # answered while it hung; r2 after it woke (and past the window)


def test_violations_in_redis_loss_window_stay_violations_and_are_counted_apart() -> None:
    failover = Fault(kind="redis-failover", t=10.0, t_end=20.0, target="redis 1", pid=1, promoted=12.0)
    # r1 was answered 0.5 s before the kill and flipped after it; r2's flip is far from any crash;
    # r3 flipped near a worker kill, which loses no Redis write.
    killed = Fault(kind="worker-kill", t=40.0, t_end=41.0, target="worker 5", pid=5)
    requests = [request("r1", "put", ok("x1", 9.5), uncertain("x1", 15.0)),
                request("r2", "put", ok("x2", 2.0), uncertain("x2", 30.0)),
                request("r3", "put", ok("x3", 39.8), uncertain("x3", 45.0))]
    ledger = (run("r1", "x1", "put", 3, 9.0, 9.2) + run("r2", "x2", "put", 3, 1.0, 1.2)
              + run("r3", "x3", "put", 3, 39, 39.2))
    table = check(requests, ledger, [failover, killed])
    assert table.flipped == ["r1", "r2", "r3"]  # strict: every flip is a violation
    assert table.in_loss_window == ["r1"]
