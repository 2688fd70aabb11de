"""Redis as production runs it: a primary, a replica and three Sentinels, with the API and a
worker on the ``redis+sentinel://`` URL. The primary is killed; calls are answered again once
the replica is promoted, nobody restarts, and what was recorded before survives."""

from __future__ import annotations

import contextlib
import shutil
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from bench.processes import ReplicatedRedis
from tests.support import Call, Load, Stack, marked, new_tmp, wait_until

# After the Sentinels agree on the new primary: the hub's reconnection backoff (1 s at most), a
# heartbeat (1 s) and a catalog refresh (1 s) bring everything back; a margin for a busy machine.
SETTLED_AFTER_S = 4.0


@contextlib.contextmanager
def replicated(env: dict[str, str] | None = None) -> Iterator[tuple[ReplicatedRedis, Stack, str]]:
    """The Redis group, a worker and an API on its Sentinel URL: (group, stack, API base URL)."""
    tmp = new_tmp()
    group = ReplicatedRedis(tmp)
    stack = Stack("", tmp)
    try:
        group.start()
        stack.redis_url = group.url
        stack.worker(env=env)
        _, base = stack.api(env)
        wait_until(lambda: httpx.get(base + "/ready").status_code == 200, what="API ready")
        yield group, stack, base
    finally:
        stack.close()
        group.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def execute(base: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(base + "/agent/execute", json=body, timeout=30)


def test_calls_are_answered_through_a_failover() -> None:
    with replicated() as (group, stack, base):
        before = execute(base, {"tool": "tally", "arguments": {"name": "before"}, "request_id": "before"})
        assert before.status_code == 200
        wait_until(group.in_sync, what="the replica has the record")  # no WAIT here: the test waits instead
        load = Load(base, lambda i: {"tool": "noop", "request_id": f"load-{i}"})
        wait_until(lambda: sum(s.status == 200 for s in load.samples) >= 5, what="calls answered")
        old = group.primary.port
        group.primary.kill()
        group.wait_failover(old)
        failed_over = time.monotonic()
        wait_until(lambda: sum(s.status == 200 and s.sent > failed_over + SETTLED_AFTER_S
                               for s in load.samples) >= 10, what="calls answered after the failover")
        load.finish()

        assert not load.failures
        outcomes = {(s.status, s.code) for s in load.samples}
        # Between the kill and the promotion, the store is unavailable. The worker was silent
        # meanwhile (its heartbeat could not land), but so was everyone: the new primary sees the
        # gap and does not take it for dead (no NO_WORKERS). A call in flight at the kill whose
        # submit had not reached the replica is lost with the primary, and answered uncertain
        # (without WAIT; loopback replication makes it rare).
        assert outcomes <= {(200, None), (503, "STORE_UNAVAILABLE"), (409, "EXECUTION_UNCERTAIN")}
        late = [(s.status, s.code) for s in load.samples if s.sent > failed_over + SETTLED_AFTER_S]
        assert late and set(late) == {(200, None)}
        assert all(proc.alive() for proc in stack.procs)  # nobody was restarted

        # The worker heartbeats into the new primary, and the record written before is there.
        ready = httpx.get(base + "/ready").json()
        assert ready["ready"] and ready["checks"]["workers"]["live"] == 1
        again = execute(base, {"tool": "tally", "arguments": {"name": "before"}, "request_id": "before"})
        assert (again.status_code, again.content) == (200, before.content)
        assert (stack.tmp / "tally-before").read_text().splitlines() == [before.json()["execution_id"]]


def test_with_wait_a_settled_record_outlives_the_primary() -> None:
    # WAIT for one replica, longer than the test holds the replica back (after the failover,
    # with no replica left, every write that matters waits this long: keep it short).
    with replicated({"CARMY_REDIS_WAIT_REPLICAS": "1", "CARMY_REDIS_WAIT_TIMEOUT": "3000"}) as (group, stack, base):
        assert group.replica is not None
        replica = group.replica.proc
        worker = stack.procs[0]
        replica.signal(signal.SIGSTOP)  # it cannot take writes: WAIT holds every write that matters
        try:
            call = Call(base, {"tool": "tally", "arguments": {"name": "kept"}, "request_id": "kept"})
            # The submit waits for the replica: nothing is answered (or run) while it is held back.
            with pytest.raises(TimeoutError):
                wait_until(lambda: not call.is_alive(), timeout=0.5, what="an answer")
        finally:
            replica.signal(signal.SIGCONT)
        first = call.result()
        assert first.status_code == 200
        execution_id = first.json()["execution_id"]
        # The worker logs an execution once its SETTLE returned, that is once a replica has the record.
        wait_until(lambda: execution_id in worker.output(), what="the worker's log line of the execution")
        old = group.primary.port
        group.primary.kill()
        group.wait_failover(old)
        again = wait_until(lambda: (r := execute(base, {"tool": "tally", "arguments": {"name": "kept"},
                                                        "request_id": "kept"})).status_code == 200 and r,
                           what="the retry answered", interval=0.2)
        assert isinstance(again, httpx.Response)
        assert again.content == first.content
        assert (stack.tmp / "tally-kept").read_text().splitlines() == [execution_id]


def test_with_wait_a_locked_tool_begins_only_once_a_replica_knows_it_began() -> None:
    """A ``parallel_safe=False`` tool that may not run twice: taking its lock marks the execution
    begun, the write that makes a later attempt uncertain instead of a second run. Like every
    other such write it must reach a replica before the tool starts, or a failover at that moment
    forgets it and the tool runs again on the promoted replica."""
    env = {"CARMY_REDIS_WAIT_REPLICAS": "1", "CARMY_REDIS_WAIT_TIMEOUT": "3000"}
    with replicated(env) as (group, stack, base):
        assert group.replica is not None
        replica, tmp = group.replica, stack.tmp
        # The first call holds the tool; the second is claimed (with a healthy replica) and waits for it.
        first = Call(base, {"tool": "exclusive_gate", "arguments": {"tag": "first"}})
        first_id = marked(tmp / "exclusive-gate-start-first").strip()
        second = Call(base, {"tool": "exclusive_gate", "arguments": {"tag": "second"}})
        with group.primary.client() as primary:
            def waiting() -> bytes | None:
                found = [k for k in primary.keys("carmy:*:exe:*")
                         if primary.hget(k, "tool") == b"exclusive_gate" and primary.hget(k, "state") == b"running"
                         and not k.endswith(first_id.encode())]
                return found[0] if found else None
            second_key = wait_until(waiting, what="the second call claimed, waiting for the lock")
            assert isinstance(second_key, bytes)
            replica.proc.signal(signal.SIGSTOP)  # from now on nothing reaches the replica
            try:
                (tmp / "gate-open-first").touch()  # the first ends and lets the lock go
                second_id = second_key.decode().rsplit(":", 1)[1]
                wait_until(lambda: primary.hget(second_key, "began") == b"1", timeout=20,
                           what="the second call took the lock")
                # Its tool must not begin while no replica knows that it began.
                with pytest.raises(TimeoutError):
                    wait_until(lambda: (tmp / "exclusive-gate-start-second").exists(), timeout=1.0,
                               what="the second tool began")
            finally:
                replica.proc.signal(signal.SIGCONT)
            assert marked(tmp / "exclusive-gate-start-second").strip() == second_id
        with replica.client() as on_replica:
            assert on_replica.hget(second_key, "began") == b"1"
        (tmp / "gate-open-second").touch()
        assert first.result().status_code == 200 and second.result().status_code == 200
