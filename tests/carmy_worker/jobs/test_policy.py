"""What becomes of a job after each kind of record: the rules of docs/protocol.md, "Jobs"."""

from __future__ import annotations

import random

import msgspec
import pytest

from carmy_worker.jobs.policy import backoff_ms, decide
from carmy_worker.sdk.errors import ToolError, error
from carmy_worker.store import records
from carmy_worker.store.jobstore import JobState
from carmy_worker.wire import Record


def job(**overrides: object) -> JobState:
    base = dict(job_id="job_1", tool="t", owner="o", status="running", request_id=None, attempts=1,
                base_attempts=0, max_attempts=3, backoff_ms=1000, max_backoff_ms=3_600_000, idempotent=False,
                run_at_ms=0, due_ms=0, created_ms=0, executions=["exec_1"], execution_id="exec_1", last_error=None,
                result=None, cancel=False, schedule=None, idem_key="")
    base.update(overrides)
    return JobState(**base)  # type: ignore[arg-type]


def failed(err: ToolError) -> Record:
    return records.failed("exec_1", "t", err.to_wire())


def code(body: bytes) -> str:
    return msgspec.json.decode(body)["code"]


def test_completed_succeeds_with_its_result() -> None:
    record = records.completed("exec_1", "t", b'{"a":1}', cacheable=False, duration_ms=1)
    d = decide(record, job(), began=True)
    assert (d.status, d.result) == ("succeeded", record.body)


def test_a_retryable_error_is_retried_after_its_backoff_then_dead_lettered() -> None:
    busy = failed(ToolError("BUSY", "later", retryable=True))
    d = decide(busy, job(attempts=1), began=True, rng=random.Random(1))
    assert d.status == "queued" and 1000 <= d.delay_ms <= 1100 and code(d.last_error) == "BUSY"
    d = decide(busy, job(attempts=2), began=True, rng=random.Random(1))
    assert d.status == "queued" and 2000 <= d.delay_ms <= 2200
    d = decide(busy, job(attempts=3), began=True)
    assert d.status == "dead_lettered" and code(d.last_error) == "BUSY"
    # An operator's retry gives a fresh budget: attempts count from there.
    assert decide(busy, job(attempts=4, base_attempts=3), began=True).status == "queued"


def test_a_non_retryable_error_fails_the_job() -> None:
    d = decide(failed(ToolError("BAD", "no", category="validation")), job(), began=True)
    assert d.status == "failed" and code(d.last_error) == "BAD"


@pytest.mark.parametrize("record", [
    records.uncertain("exec_1", "t", "its worker stopped"),
    records.panic("exec_1", "t"),
    records.timed_out("exec_1", "t", 5.0),
], ids=["uncertain", "panic", "timeout"])
def test_an_uncertain_outcome_dead_letters_a_non_idempotent_job_and_retries_an_idempotent_one(record: Record) -> None:
    d = decide(record, job(idempotent=False), began=True)
    assert d.status == "dead_lettered"
    dead = msgspec.json.decode(d.last_error)
    assert dead["code"] == "EXECUTION_UNCERTAIN"
    assert dead["details"]["cause"] == record.error_code
    assert decide(record, job(idempotent=True), began=True).status == "queued"


def test_an_attempt_that_never_began_is_tried_again_whatever_the_tool() -> None:
    d = decide(records.never_started("exec_1", "t"), job(idempotent=False), began=False)
    assert d.status == "queued"
    # Timed out waiting for its lock (parallel_safe=False): the tool never began either.
    assert decide(records.timed_out("exec_1", "t", 5.0), job(idempotent=False), began=False).status == "queued"


def test_a_cancelled_attempt_or_a_cancelled_job_ends_cancelled() -> None:
    assert decide(records.cancelled("exec_1", "t", started=True), job(), began=True).status == "cancelled"
    busy = failed(ToolError("BUSY", "later", retryable=True))
    assert decide(busy, job(cancel=True), began=True).status == "cancelled"


def test_retry_after_lengthens_the_backoff_never_shortens_it() -> None:
    assert backoff_ms(1, base_ms=1000, cap_ms=10_000, retry_after_s=30, rng=random.Random(0)) >= 30_000
    assert 8000 <= backoff_ms(4, base_ms=1000, cap_ms=10_000, retry_after_s=1, rng=random.Random(0)) <= 8800
    assert 10_000 <= backoff_ms(60, base_ms=1000, cap_ms=10_000, rng=random.Random(0)) <= 11_000
    err = error("QUEUE_FULL", "full", retry_after=7)
    d = decide(records.failed("exec_1", "t", err), job(), began=True)
    assert d.status == "queued" and d.delay_ms >= 7000
