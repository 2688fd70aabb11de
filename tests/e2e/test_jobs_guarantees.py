"""What jobs promise under crashes, with real API, worker and Redis processes: none lost, none
started twice, none started before its run_at; a non-idempotent job cut short is dead-lettered,
never run again; a schedule fires each occurrence once across two APIs and four workers.

Every tool run appends a line (when it began, its request id) to a file: the count outside Redis.
"""

from __future__ import annotations

import collections
import datetime
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import private_stack
from tests.support import RedisServer, Stack, wait_until

FINISHED = ("succeeded", "failed", "dead_lettered", "cancelled")


@pytest.fixture
def durable_stack() -> Iterator[tuple[RedisServer, Stack]]:
    # AOF fsynced on every write: a job accepted (202) is on disk before its answer.
    with private_stack(durable=True, fsync="always") as pair:
        yield pair


def runs(path: Path) -> list[tuple[int, str]]:
    """(began ms, request id) of each run a tool recorded in ``path``."""
    if not path.exists():
        return []
    return [(int(ms), rid) for ms, rid in (line.split(" ", 1) for line in path.read_text().splitlines() if line)]


def ms(rfc3339: str) -> int:
    return round(datetime.datetime.fromisoformat(rfc3339).timestamp() * 1000)


def job(base: str, job_id: str) -> dict:
    r = httpx.get(f"{base}/agent/jobs/{job_id}", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def all_finished(base: str, ids: list[str]) -> list[dict] | None:
    try:
        views = [job(base, i) for i in ids]
    except httpx.HTTPError:
        return None
    return views if all(v["status"] in FINISHED for v in views) else None


def test_jobs_survive_api_worker_and_redis_restarts(durable_stack: tuple[RedisServer, Stack]) -> None:
    server, stack = durable_stack
    worker = stack.worker("tests.toolsets.jobs")
    api, base = stack.api()
    wait_until(lambda: "flaky_once" in httpx.get(base + "/agent/tools").text)
    created: dict[str, dict] = {}
    for i in range(30):
        # Non-idempotent: an attempt must never run twice. Due over the next 4 s; every third
        # fails once (retryably) first, so retries are under way when everything is killed.
        body = {"tool": "flaky_once", "arguments": {"name": f"j{i}", "fail_times": 1 if i % 3 == 0 else 0},
                "request_id": f"j{i}", "delay_ms": (i % 10) * 400}
        r = httpx.post(base + "/agent/jobs", json=body, timeout=10)
        assert r.status_code == 202, r.text
        created[r.json()["job_id"]] = body
    out = stack.tmp
    # Some have run, most have not: kill everything at once.
    wait_until(lambda: sum(len(runs(out / f"flaky-once-j{i}")) for i in range(30)) >= 5)
    worker.kill()
    api.kill()
    server.kill()
    server.start()
    stack.worker("tests.toolsets.jobs")
    _, base = stack.api()

    views = wait_until(lambda: all_finished(base, list(created)), timeout=60, what="every job finished")
    assert isinstance(views, list)
    for view in views:
        body = created[view["job_id"]]
        name = body["arguments"]["name"]
        attempts = runs(out / f"flaky-once-{name}")
        request_ids = [rid for _, rid in attempts]
        # None started twice: each attempt's request id ran at most once.
        assert len(request_ids) == len(set(request_ids)), (name, request_ids)
        # None started before its run_at (both clocks are this machine's).
        if attempts:
            assert min(began for began, _ in attempts) >= ms(view["created_at"]) + body["delay_ms"]
        if view["status"] == "succeeded":
            assert attempts and view["result"]["status"] == "completed"
            assert len(view["executions"]) == view["attempts"]
        else:
            # Cut short by the kill after its tool began (possibly before the tool wrote its line:
            # BEGIN marks it just before the tool starts): never run again by itself.
            assert view["status"] == "dead_lettered", view
            assert view["last_error"]["code"] == "EXECUTION_UNCERTAIN"
    assert sum(v["status"] == "succeeded" for v in views) >= 25


def test_a_non_idempotent_job_cut_short_is_dead_lettered_and_never_run_again(fresh_stack: Stack) -> None:
    stack = fresh_stack
    first = stack.worker("tests.toolsets.jobs")
    _, base = stack.api()
    wait_until(lambda: "charge" in httpx.get(base + "/agent/tools").text)
    r = httpx.post(base + "/agent/jobs", json={"tool": "charge", "arguments": {"name": "k", "seconds": 20},
                                               "request_id": "k"})
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    wait_until(lambda: len(runs(stack.tmp / "charge-k")) == 1)
    first.kill()
    stack.worker("tests.toolsets.jobs")

    view = wait_until(lambda: (v := job(base, job_id))["status"] in FINISHED and v, timeout=30)
    assert isinstance(view, dict)
    assert view["status"] == "dead_lettered"
    assert view["attempts"] == 1
    assert view["last_error"]["code"] == "EXECUTION_UNCERTAIN"
    assert view["last_error"]["details"]["cause"] == "EXECUTION_UNCERTAIN"
    # The new worker runs other jobs meanwhile, and the dead letter still does not run.
    r = httpx.post(base + "/agent/jobs", json={"tool": "stamp", "arguments": {"name": "after"}})
    wait_until(lambda: job(base, r.json()["job_id"])["status"] == "succeeded")
    assert len(runs(stack.tmp / "charge-k")) == 1
    assert job(base, job_id)["status"] == "dead_lettered"


def test_an_idempotent_job_cut_short_runs_again_and_succeeds(fresh_stack: Stack) -> None:
    stack = fresh_stack
    first = stack.worker("tests.toolsets.jobs")
    _, base = stack.api()
    wait_until(lambda: "sync_mirror" in httpx.get(base + "/agent/tools").text)
    r = httpx.post(base + "/agent/jobs", json={"tool": "sync_mirror", "arguments": {"name": "m", "seconds": 1}})
    job_id = r.json()["job_id"]
    wait_until(lambda: len(runs(stack.tmp / "sync-mirror-m")) == 1)
    first.kill()
    stack.worker("tests.toolsets.jobs")
    view = wait_until(lambda: (v := job(base, job_id))["status"] in FINISHED and v, timeout=30)
    assert isinstance(view, dict) and view["status"] == "succeeded", view
    assert len(runs(stack.tmp / "sync-mirror-m")) == 2


def test_two_apis_and_four_workers_fire_each_occurrence_once(fresh_stack: Stack) -> None:
    stack = fresh_stack
    workers = [stack.worker("tests.toolsets.scheduled") for _ in range(4)]
    bases = [stack.api()[1] for _ in range(2)]
    ticks = stack.tmp / "ticks"

    def occurrences() -> list[str]:
        return [line.split(" ")[0] for line in ticks.read_text().splitlines()] if ticks.exists() else []

    wait_until(lambda: len(occurrences()) >= 4, timeout=30)
    # Two of them leave (drained, so no tick is cut short: that would be a dead letter, not a
    # skip); the others go on firing.
    workers[0].stop()
    workers[1].stop()
    seen = len(occurrences())
    wait_until(lambda: len(occurrences()) >= seen + 3, timeout=30)

    fired = occurrences()
    assert all(o.startswith("schedule:every-second@") for o in fired)
    duplicates = [o for o, n in collections.Counter(fired).items() if n > 1]
    assert not duplicates
    # One job a second, none skipped, from the first occurrence to the last.
    seconds = sorted(ms(o.split("@", 1)[1]) // 1000 for o in fired)
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds))), seconds
    for base in bases:
        [schedule] = httpx.get(base + "/agent/schedules").json()["schedules"]
        assert schedule["name"] == "every-second" and schedule["tool"] == "tick"
        assert schedule["fired"] >= len(fired) and schedule["skipped"] == 0
