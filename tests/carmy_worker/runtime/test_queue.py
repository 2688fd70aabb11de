"""The arq seam: what reaches arq when our handler cannot reach Redis."""

from __future__ import annotations

import pytest
from arq.worker import Retry
from redis.exceptions import ConnectionError as RedisConnectionError

from carmy_worker.runtime import queue
from carmy_worker.store import jobs


async def test_a_redis_failure_puts_the_job_back_instead_of_failing_it() -> None:
    async def handler(payload: bytes, lease: str, then: object = None) -> None:
        raise RedisConnectionError("gone")

    pool = queue.connect("redis://127.0.0.1:1/0")  # never connected: the handler fails first
    worker = queue.build_worker(handler, pool=pool, worker_id="w", group="g", concurrency=1, max_timeout=1,
                                drain_seconds=1)
    function = worker.functions[jobs.FUNCTION]
    # arq drops a job whose function raised; a Retry puts it back in the queue.
    with pytest.raises(Retry):
        await function.coroutine({"job_id": "exec_x"}, b"payload")
    await pool.aclose(close_connection_pool=True)


async def test_the_handler_gets_the_payload() -> None:
    seen: list[bytes] = []

    async def handler(payload: bytes, lease: str, then: object = None) -> None:
        seen.append(payload)

    pool = queue.connect("redis://127.0.0.1:1/0")
    worker = queue.build_worker(handler, pool=pool, worker_id="w", group="g", concurrency=1, max_timeout=1,
                                drain_seconds=1)
    await worker.functions[jobs.FUNCTION].coroutine({"job_id": "exec_x"}, b"payload")
    assert seen == [b"payload"]
    await pool.aclose(close_connection_pool=True)


async def test_a_run_that_failed_is_surfaced_and_one_that_ended_well_is_unlisted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The loop that starts jobs looks only at the runs that failed (not at every running task):
    # a run ending well unlists itself, and one that failed is raised there, as arq does.
    import asyncio

    from carmy_worker.store.leases import Lease

    async def handler(payload: bytes, lease: str, then: object = None) -> None:
        pass

    pool = queue.connect("redis://127.0.0.1:1/0")
    worker = queue.build_worker(handler, pool=pool, worker_id="w", group="g", concurrency=4, max_timeout=1,
                                drain_seconds=1)
    worker._slot_freed, worker._ends, worker._failed = asyncio.Event(), {}, []

    async def run_job(job_id: str, score: int) -> None:
        if job_id == "bad":
            raise ValueError("run_job itself failed")

    async def heart_beat() -> None:
        pass

    monkeypatch.setattr(worker, "run_job", run_job)
    monkeypatch.setattr(worker, "heart_beat", heart_beat)
    assert await worker._start_due([Lease("ok", 0, "t1"), Lease("bad", 0, "t2")]) == 2
    await asyncio.gather(*worker.tasks.values(), return_exceptions=True)
    assert list(worker.tasks) == ["bad"] and worker._failed == ["bad"]
    with pytest.raises(ValueError, match="run_job itself failed"):
        await worker._start_due([])
    assert worker.tasks == {} and worker._failed == []
    await pool.aclose(close_connection_pool=True)


async def test_a_handler_stuck_past_arqs_timeout_is_cancelled_and_the_job_fails_as_arq_would(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # arq's run_job fails (and finishes) a job whose function raised TimeoutError, as its own
    # wait_for did; the backstop is the job's task's own now, and arq waits without a timeout.
    import asyncio

    monkeypatch.setattr(queue, "ARQ_TIMEOUT_MARGIN_S", 0.05)
    stopped: list[str] = []

    async def handler(payload: bytes, lease: str, then: object = None) -> None:
        try:
            await asyncio.Event().wait()  # stuck (a Redis that never answers)
        except asyncio.CancelledError:
            stopped.append("cancelled")
            raise

    pool = queue.connect("redis://127.0.0.1:1/0")
    worker = queue.build_worker(handler, pool=pool, worker_id="w", group="g", concurrency=1, max_timeout=0,
                                drain_seconds=1)
    assert worker.job_timeout_s is None and worker.functions[jobs.FUNCTION].timeout_s is None
    assert worker.in_progress_timeout_s == 0.05 + 10  # arq's leases are sized as before: timeout + 10 s
    job = asyncio.ensure_future(worker.functions[jobs.FUNCTION].coroutine({"job_id": "exec_x"}, b"payload"))
    with pytest.raises(TimeoutError):
        await job
    assert stopped == ["cancelled"]
    await pool.aclose(close_connection_pool=True)


async def test_a_job_cancelled_from_outside_stays_cancelled_whatever_its_backstop() -> None:
    # A shutdown cancels a job's run: that is a cancellation (arq puts the job back), not a timeout.
    import asyncio

    started = asyncio.Event()

    async def handler(payload: bytes, lease: str, then: object = None) -> None:
        started.set()
        await asyncio.Event().wait()

    pool = queue.connect("redis://127.0.0.1:1/0")
    worker = queue.build_worker(handler, pool=pool, worker_id="w", group="g", concurrency=1, max_timeout=60,
                                drain_seconds=1)
    job = asyncio.ensure_future(worker.functions[jobs.FUNCTION].coroutine({"job_id": "exec_x"}, b"payload"))
    await started.wait()
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    await pool.aclose(close_connection_pool=True)
