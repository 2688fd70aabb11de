"""At most once and one final status, with real worker processes killed and paused.

The tools append a line to a file for every run: that count, outside Redis, is the truth.
"""

from __future__ import annotations

import signal
import time

import httpx
import redis

from carmy_worker.store import jobs, keys
from tests.support import Call, Proc, Stack, wait_until


def lines(stack: Stack, name: str) -> int:
    path = stack.tmp / name
    return len(path.read_text().splitlines()) if path.exists() else 0


def start(stack: Stack) -> tuple[Proc, str]:
    first = stack.worker()
    _, base = stack.api()
    wait_until(lambda: "tally" in httpx.get(base + "/agent/tools").text)
    return first, base


def test_kill9_mid_non_idempotent_tool_runs_it_once(fresh_stack: Stack, sync_redis: redis.Redis) -> None:
    stack = fresh_stack
    worker_a, base = start(stack)
    body = {"tool": "tally", "arguments": {"name": "k9", "seconds": 8}, "request_id": "k9"}
    call = Call(base, body)
    wait_until(lambda: lines(stack, "tally-k9") == 1)
    killed_at = time.monotonic()
    worker_a.kill()
    stack.worker()

    r = call.result()
    assert call.finished_at - killed_at < 8  # heartbeats, not arq's in-progress expiry (55 s here)
    assert r.status_code == 409
    body_json = r.json()
    assert body_json["status"] == "failed"
    assert body_json["error"]["code"] == "EXECUTION_UNCERTAIN"
    assert body_json["error"]["category"] == "conflict"
    assert "before calling again" in body_json["error"]["message"]
    # Settled by the janitor's REAP (a Lua verdict): the same next_actions as any writer's.
    assert body_json["_agent"]["next_actions"] == [{"action": "reconcile", "tool": "tally"}]

    retry = httpx.post(base + "/agent/execute", json=body)
    assert retry.status_code == 409
    assert retry.content == r.content
    # The job went back to arq's queue and reached the new worker, which dropped it unrun.
    exec_id = body_json["execution_id"]
    wait_until(lambda: not sync_redis.exists(jobs.job_key(exec_id)))
    assert lines(stack, "tally-k9") == 1


def test_kill9_mid_idempotent_tool_completes(fresh_stack: Stack) -> None:
    stack = fresh_stack
    worker_a, base = start(stack)
    call = Call(base, {"tool": "tally_idem", "arguments": {"name": "k9i", "seconds": 2}, "request_id": "k9i"})
    wait_until(lambda: lines(stack, "tally-idem-k9i") == 1)
    worker_a.kill()
    stack.worker()
    r = call.result()
    assert r.status_code == 200, r.text
    assert r.json()["data"] == {"n": 2}  # it ran again, on the new worker
    assert lines(stack, "tally-idem-k9i") == 2


def settle_while_paused(stack: Stack, tool: str, name: str) -> tuple[httpx.Response, Proc]:
    worker_a, base = start(stack)
    call = Call(base, {"tool": tool, "arguments": {"name": name, "seconds": 2}})
    wait_until(lambda: lines(stack, f"{tool.replace('_', '-')}-{name}") == 1)
    worker_a.signal(signal.SIGSTOP)
    stack.worker()
    return call.result(), worker_a


def test_paused_worker_stops_its_tool_and_cannot_overwrite_an_idempotent_rerun(
    fresh_stack: Stack, sync_redis: redis.Redis,
) -> None:
    r, paused = settle_while_paused(fresh_stack, "tally_idem", "stop")
    assert r.status_code == 200
    assert r.json()["data"] == {"n": 2}  # the re-run on the other worker settled it
    key = keys.record(r.json()['execution_id'])
    before = sync_redis.get(key)
    paused.signal(signal.SIGCONT)
    # On waking it learns it lost the execution, and its tool never takes the step after its
    # sleep (which ended while it was stopped): only the re-run's completion is in the ledger.
    wait_until(lambda: "outcome of attempt 1 is dropped" in paused.output())
    assert sync_redis.get(key) == before
    assert (fresh_stack.tmp / "tally-idem-done-stop").read_text().split()[1:] == ["2"]


def test_paused_worker_stops_its_tool_after_an_uncertain_verdict(fresh_stack: Stack, sync_redis: redis.Redis) -> None:
    r, paused = settle_while_paused(fresh_stack, "tally", "stop")
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "EXECUTION_UNCERTAIN"
    key = keys.record(r.json()['execution_id'])
    before = sync_redis.get(key)
    paused.signal(signal.SIGCONT)
    wait_until(lambda: "outcome of attempt 1 is dropped" in paused.output())
    assert sync_redis.get(key) == before
    assert lines(fresh_stack, "tally-stop") == 1  # nothing ran it again
    # The caller was told "uncertain"; the paused tool did not go on to its side effect after that.
    assert not (fresh_stack.tmp / "tally-done-stop").exists()
