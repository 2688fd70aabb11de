"""Jobs through HTTP, run by real worker processes (``tests.toolsets.jobs``): a delayed job
starts no sooner than its run_at, retries run as attempts of their own (each an execution, each
under its own request id), a failure for good ends the job, running out of attempts leaves a
dead letter an operator sees and queues again, and a running job cancelled is not tried again.

The tools write each run (when it began, its request id) to a file: what really ran, counted
outside Redis."""

from __future__ import annotations

import contextlib
import datetime
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from carmy_worker.store.jobstore import FINISHED
from tests.e2e.test_operations import metric
from tests.support import Stack, wait_until

ALICE, OPS = "alice-token-0123456789", "ops-token-0123456789ab"
KEYS = json.dumps({ALICE: {"principal": "alice"}, OPS: {"principal": "ops", "permissions": ["carmy:operator"]}})
AS_ALICE = {"authorization": f"Bearer {ALICE}"}
AS_OPS = {"authorization": f"Bearer {OPS}"}


@dataclass
class Api:
    base: str
    tmp: Path
    client: httpx.Client

    def create(self, tool: str, name: str, **fields: Any) -> dict[str, Any]:
        work: dict[str, Any] = {"name": name}
        work.update({k: fields.pop(k) for k in ("fail_times", "seconds") if k in fields})
        r = self.client.post(self.base + "/agent/jobs", json={"tool": tool, "arguments": work, **fields},
                             headers=AS_ALICE)
        assert r.status_code == 202, r.text
        assert r.headers["location"] == f"/agent/jobs/{r.json()['job_id']}"
        job: dict[str, Any] = r.json()
        return job

    def get(self, job_id: str, headers: dict[str, str] = AS_ALICE) -> dict[str, Any]:
        r = self.client.get(f"{self.base}/agent/jobs/{job_id}", headers=headers)
        assert r.status_code == 200, r.text
        job: dict[str, Any] = r.json()
        return job

    def finished(self, job_id: str, timeout: float = 30) -> dict[str, Any]:
        """The job once it has finished."""
        job: dict[str, Any] = wait_until(lambda: (j := self.get(job_id))["status"] in FINISHED and j, timeout,
                                         what=f"job {job_id} finished")  # type: ignore[assignment]
        return job

    def runs(self, file: str) -> list[tuple[int, str]]:
        """Each run a tool recorded in ``file``: (when it began, ms; its request id)."""
        path = self.tmp / file
        if not path.exists():
            return []
        return [(int(at), rid) for at, rid in (line.split(" ", 1) for line in path.read_text().splitlines())]

    def execution(self, exec_id: str) -> httpx.Response:
        return self.client.get(f"{self.base}/agent/executions/{exec_id}", headers=AS_ALICE)

    def job_lines(self, job_id: str) -> list[dict[str, Any]]:
        """The job loops' log lines (JSON, every worker's) about ``job_id``."""
        lines = [json.loads(line) for log in sorted(self.tmp.glob("worker-*.log"))
                 for line in log.read_text().splitlines() if line.startswith("{") and job_id in line]
        return [line for line in lines if line.get("message") == "job"]


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[Api]:
    with job_api(stack) as a:
        yield a


@contextlib.contextmanager
def job_api(stack: Stack, env: dict[str, str] | None = None) -> Iterator[Api]:
    """A worker of ``tests.toolsets.jobs`` and an API with Alice's and the operator's keys, both
    with ``env``, once the API lists the job tools."""
    stack.worker("tests.toolsets.jobs", env=env)
    _, base = stack.api({"CARMY_API_KEYS": KEYS, **(env or {})})
    with httpx.Client(timeout=30) as client:
        wait_until(lambda: "stamp" in client.get(base + "/agent/tools", headers=AS_ALICE).text)
        yield Api(base, stack.tmp, client)


def ms(rfc: str) -> int:
    return round(datetime.datetime.fromisoformat(rfc).timestamp() * 1000)


def test_a_delayed_job_runs_once_not_before_its_run_at(api: Api) -> None:
    job = api.create("stamp", "delayed", delay_ms=1500, request_id="delayed")
    assert job["status"] == "queued" and ms(job["run_at"]) == ms(job["created_at"]) + 1500
    done = api.finished(job["job_id"])
    [(began, rid)] = api.runs("stamp-delayed")
    assert began >= ms(job["run_at"])  # the tool's own clock: it never started early
    assert rid == "delayed"
    assert {k: done[k] for k in ("status", "attempts", "last_error", "run_at")} == {
        "status": "succeeded", "attempts": 1, "last_error": None, "run_at": job["run_at"]}
    [exec_id] = done["executions"]
    assert done["result"] == {"execution_id": exec_id, "status": "completed",
                              "data": {"name": "delayed", "run": 1, "at_ms": began},
                              "_agent": {"cacheable": True, "next_actions": []}}
    record = api.execution(exec_id)
    assert (record.status_code, record.json()) == (200, done["result"])
    lateness = api.client.get(api.base + "/metrics", headers=AS_OPS).text
    assert metric(lateness, "carmy_job_lateness_seconds_count", tool="stamp") >= 1
    assert metric(lateness, "carmy_jobs_total", tool="stamp", status="succeeded") >= 1


def test_retryable_failures_are_attempts_of_their_own(api: Api) -> None:
    job = api.create("flaky", "thrice", fail_times=2, request_id="rid")
    done = api.finished(job["job_id"])
    assert (done["status"], done["attempts"], done["max_attempts"]) == ("succeeded", 3, 3)
    assert [rid for _, rid in api.runs("flaky-thrice")] == ["rid", "rid#2", "rid#3"]
    assert len(done["executions"]) == 3 == len(set(done["executions"]))
    answers = [api.execution(e) for e in done["executions"]]
    assert [(a.status_code, a.json()["status"]) for a in answers] == [(503, "failed"), (503, "failed"),
                                                                       (200, "completed")]
    assert [a.json()["error"]["code"] for a in answers[:2]] == ["UPSTREAM_BUSY", "UPSTREAM_BUSY"]
    assert done["result"] == answers[2].json() and done["result"]["data"]["run"] == 3
    assert done["last_error"]["code"] == "UPSTREAM_BUSY"  # the latest attempt that failed
    # One log line an attempt, naming the job, its execution and what became of the job.
    lines = wait_until(lambda: len(found := api.job_lines(job["job_id"])) == 3 and found)
    assert [(line["attempt"], line["execution_id"], line["error_code"], line["status"]) for line in lines] == [
        (1, done["executions"][0], "UPSTREAM_BUSY", "queued"), (2, done["executions"][1], "UPSTREAM_BUSY", "queued"),
        (3, done["executions"][2], None, "succeeded")]


def test_a_failure_for_good_ends_the_job_failed(api: Api) -> None:
    job = api.create("refuse", "never")
    done = api.finished(job["job_id"])
    assert (done["status"], done["attempts"], len(done["executions"])) == ("failed", 1, 1)
    assert done["last_error"]["code"] == "BAD_INPUT"
    assert done["result"]["error"]["code"] == "BAD_INPUT"
    assert len(api.runs("refuse-never")) == 1
    assert api.client.post(f"{api.base}/agent/jobs/{job['job_id']}/retry", headers=AS_ALICE).status_code == 403


def test_out_of_attempts_is_a_dead_letter_an_operator_queues_again(api: Api) -> None:
    job = api.create("flaky", "dead", fail_times=10, request_id="dead")
    dead = api.finished(job["job_id"])
    assert (dead["status"], dead["attempts"], len(dead["executions"])) == ("dead_lettered", 3, 3)
    assert dead["last_error"]["code"] == "UPSTREAM_BUSY"
    listed = api.client.get(api.base + "/agent/jobs", params={"status": "dead_lettered"}, headers=AS_OPS)
    assert listed.status_code == 200 and dead in listed.json()["jobs"]
    metrics = api.client.get(api.base + "/metrics", headers=AS_OPS).text
    assert metric(metrics, "carmy_dead_letters") >= 1

    r = api.client.post(f"{api.base}/agent/jobs/{job['job_id']}/retry", headers=AS_OPS)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "queued" and r.json()["attempts"] == 3
    listed = api.client.get(api.base + "/agent/jobs", params={"status": "dead_lettered"}, headers=AS_OPS)
    assert job["job_id"] not in [j["job_id"] for j in listed.json()["jobs"]]
    # A fresh budget of three attempts, each under its own request id; they fail too.
    again = api.finished(job["job_id"])
    assert (again["status"], again["attempts"], len(again["executions"])) == ("dead_lettered", 6, 6)
    assert [rid for _, rid in api.runs("flaky-dead")] == ["dead", "dead#2", "dead#3", "dead#4", "dead#5", "dead#6"]


def test_a_running_job_cancelled_is_not_tried_again(api: Api) -> None:
    job = api.create("sync_mirror", "cancelled", seconds=5)
    wait_until(lambda: api.runs("sync-mirror-cancelled"), what="the tool started")
    running = api.get(job["job_id"])
    assert running["status"] == "running"
    r = api.client.delete(f"{api.base}/agent/jobs/{job['job_id']}", headers=AS_ALICE)
    assert r.status_code == 200, r.text
    cancelled = r.json()
    assert (cancelled["status"], cancelled["attempts"]) == ("cancelled", 1)
    [exec_id] = cancelled["executions"]
    record = api.execution(exec_id)
    assert record.json()["status"] == "cancelled"
    # A job due after any retry of it would have been: once it has run, that retry would have too.
    later = api.create("stamp", "after-cancel", delay_ms=2000)
    api.finished(later["job_id"])
    assert len(api.runs("sync-mirror-cancelled")) == 1
    assert api.get(job["job_id"]) == cancelled
