"""At most once and one final status, with real worker processes killed and paused.

The tools append a line to a file for every run: that count, outside Redis, is the truth.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import redis

from carmy_worker.store import jobs, keys
from tests import sse
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


def test_kill9_mid_idempotent_tool_with_no_worker_left_times_out_within_the_queue_timeout(
    fresh_stack: Stack, sync_redis: redis.Redis,
) -> None:
    """Put back in the queue, the call waits for a worker as long as a new one would, from then:
    its group's last worker died, so it is answered ``TIMEOUT`` (not an hour on, when the group
    is gone), and a worker that comes later finds it settled and does not run it again."""
    stack = fresh_stack
    worker_a = stack.worker()
    _, base = stack.api(env={"CARMY_QUEUE_TIMEOUT": "2"})
    wait_until(lambda: "tally_idem" in httpx.get(base + "/agent/tools").text)
    call = Call(base, {"tool": "tally_idem", "arguments": {"name": "alone", "seconds": 8}})
    wait_until(lambda: lines(stack, "tally-idem-alone") == 1)
    killed_at = time.monotonic()
    worker_a.kill()
    r = call.result(timeout=60)
    assert r.status_code == 504, r.text
    error = r.json()["error"]
    assert error["code"] == "TIMEOUT"
    assert "put back in the queue" in error["message"]
    # The janitor's REAP (heartbeats: a few seconds), then the queue timeout of 2 s: not the hour
    # its group has left before it is gone.
    assert call.finished_at - killed_at < 25
    exec_id = r.json()["execution_id"]
    stack.worker()  # serves the same tools: the job, still queued, reaches it and is dropped unrun
    wait_until(lambda: not sync_redis.exists(jobs.job_key(exec_id)))
    assert lines(stack, "tally-idem-alone") == 1


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


def test_a_paused_attempts_late_progress_never_reaches_the_stream_of_the_next(fresh_stack: Stack) -> None:
    """A sync tool's thread cannot be stopped: when its worker wakes from a pause in which the
    execution went to another attempt, it goes on reporting. Redis drops those events (PROGRESS
    publishes only for the attempt that holds the execution), so the caller's stream, once the
    new attempt has spoken, carries none of the old one's."""
    worker_a, base = start(fresh_stack)
    messages: list[str] = []  # the stream's progress messages, in order
    with httpx.Client(timeout=30) as client, client.stream(
        "POST", base + "/agent/execute", json={"tool": "report_attempt", "arguments": {"steps": 150}},
        headers={"accept": "text/event-stream"},
    ) as r:
        events = iter_events(r)

        def read_until(message: str) -> None:
            for name, data in events:
                if name == "tool.progress":
                    messages.append(data["message"])
                    if data["message"] == message:
                        return
            raise AssertionError(f"the stream ended before {message!r}: {messages[-3:]}")

        read_until("attempt 1")
        worker_a.signal(signal.SIGSTOP)
        fresh_stack.worker()
        read_until("attempt 2")  # A was found dead; its execution runs again on B
        worker_a.signal(signal.SIGCONT)  # its thread reports at once, as attempt 1
        wait_until(lambda: "outcome of attempt 1 is dropped" in worker_a.output())
        last = ""
        for last, data in events:
            if last == "tool.progress":
                messages.append(data["message"])
    assert last == "execution.completed" and data["data"] == {"n": 150}
    after = messages[messages.index("attempt 2"):]
    assert "attempt 1" not in after, f"attempt 1 reported after attempt 2 took over: {after.count('attempt 1')} times"
    assert after.count("attempt 2") > 100  # attempt 2's own went out meanwhile
    # Whether any of attempt 1's late events reached Redis before its worker learnt of the loss
    # (and closed its publisher) is a race between two of its threads; without the check in
    # PROGRESS, they leaked into this stream in two runs of three. `test_publisher.py` checks the
    # refusal itself, and the worker's count of it, without a race.


def iter_events(r: httpx.Response) -> Iterator[tuple[str, Any]]:
    """An SSE response's events as they come, as ``tests.sse.parse`` reads them."""
    block = ""
    for line in r.iter_lines():
        if line:
            block += line + "\n"
            continue
        yield from sse.parse(block)
        block = ""
