"""The jobs of the chaos load, without processes: which attempt a request id names, what a job
asks for (seeded, one due time, the same body on every retry), and which reads are kept."""

from __future__ import annotations

import datetime
import random
import time

import pytest

from chaos.jobload import body, keep, new_job
from chaos.model import JobRead, attempt_of


def test_the_attempt_is_read_from_the_request_id() -> None:
    assert attempt_of("c1-j7") == ("c1-j7", 1)
    assert attempt_of("c1-j7#3") == ("c1-j7", 3)
    assert attempt_of("schedule:chaos-tick@2026-12-02T10:00:01.000Z#2") == (
        "schedule:chaos-tick@2026-12-02T10:00:01.000Z", 2)
    assert attempt_of("a#b") == ("a#b", 1)


def test_a_job_asks_for_one_due_time_the_same_on_every_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two jobs made a millisecond apart would ask for run_at a millisecond apart: one clock here.
    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.25)
    jobs = [new_job(random.Random(5), f"r{i}") for i in range(2)]
    assert body(jobs[0]) | {"request_id": "r1"} == body(jobs[1])  # seeded: the same draws
    monkeypatch.undo()
    assert body(jobs[0]) == body(jobs[0])  # a retry, later, sends the same body
    many = [new_job(random.Random(i), "r") for i in range(200)]
    assert all((job.delay_ms is None) != (job.run_at is None) for job in many)
    assert {"delay_ms" in body(job) for job in many} == {True, False}
    for job in many:
        if job.run_at is not None:
            assert datetime.datetime.fromisoformat(job.run_at).tzinfo is not None  # RFC 3339 with an offset
            assert -0.001 <= datetime.datetime.fromisoformat(job.run_at).timestamp() - job.first <= 2.0
    assert {job.tool for job in many} == {"job_put", "job_charge"}
    assert any(job.args["fail"] >= job.max_attempts for job in many)  # some end dead-lettered


def test_only_reads_that_change_something_are_kept_but_the_last_ones_always() -> None:
    job = new_job(random.Random(1), "r")
    for t, status in [(1.0, "queued"), (2.0, "queued"), (3.0, "running"), (4.0, "succeeded")]:
        keep(job, JobRead(t=t, status=status))
    keep(job, None)  # no answer: nothing learnt
    assert [read.t for read in job.reads] == [1.0, 3.0, 4.0]
    keep(job, JobRead(t=5.0, status="succeeded"), always=True)
    assert [read.t for read in job.reads] == [1.0, 3.0, 4.0, 5.0]
