"""arq's private surface, pinned: ``carmy_worker.runtime.queue`` overrides arq internals and the
API writes arq's jobs without arq. An arq release that renames, re-signs or re-lays-out any of
it must fail here, loudly, rather than in production."""

from __future__ import annotations

import inspect

import arq
import arq.constants
import arq.jobs
import arq.worker
import pytest

from carmy_worker.runtime import queue
from carmy_worker.store import jobs
from carmy_worker.store.leases import Lease
from carmy_worker.wire import ExecutionJob, msgpack_encoder

# What each name of arq.worker.Worker that we override or call looks like in the arq we support.
SIGNATURES = {
    "main": "(self) -> None",
    "handle_sig_wait_for_completion": "(self, signum: signal.Signals) -> None",
    "_sleep_until_tasks_complete": "(self) -> None",
    "_release_sem_dec_counter_on_complete": "(self) -> None",
    "run_job": "(self, job_id: str, score: int) -> None",
    "heart_beat": "(self) -> None",
    "finish_job": ("(self, job_id: str, finish: bool, result_data: Optional[bytes], result_timeout_s: "
                   "Optional[float], keep_result_forever: bool, incr_score: Optional[int], "
                   "keep_in_progress: Optional[float]) -> None"),
    "finish_failed_job": "(self, job_id: str, result_data: Optional[bytes]) -> None",
}


def test_the_supported_arq_release() -> None:
    assert arq.VERSION.startswith("0.28."), "queue.py overrides arq internals: re-check ARQ_PRIVATE_SURFACE"


def test_every_method_we_override_or_call_keeps_its_signature() -> None:
    named = (queue.ARQ_PRIVATE_SURFACE["arq.worker.Worker methods overridden"]
             + queue.ARQ_PRIVATE_SURFACE["arq.worker.Worker methods called"])
    assert sorted(named) == sorted(SIGNATURES)
    for name, expected in SIGNATURES.items():
        assert str(inspect.signature(getattr(arq.worker.Worker, name))) == expected, name


async def test_every_attribute_we_touch_exists_on_a_worker() -> None:
    async def handler(payload: bytes, lease: str, then: object = None) -> None:
        pass

    pool = queue.connect("redis://127.0.0.1:1/0")  # never connected
    worker = queue.build_worker(handler, pool=pool, worker_id="w", group="g", concurrency=3, max_timeout=1,
                                drain_seconds=1)
    missing = [a for a in queue.ARQ_PRIVATE_SURFACE["arq.worker.Worker attributes"] if not hasattr(worker, a)]
    assert missing == []
    # The ones whose meaning the lease loop relies on.
    assert (worker.max_jobs, worker.job_counter, worker.tasks, worker.allow_pick_jobs) == (3, 0, {}, True)
    assert worker.allow_abort_jobs is False  # else run_job's first pipeline has one more command
    assert worker.queue_name == jobs.queue_name("g", 0)
    await pool.aclose(close_connection_pool=True)


def test_run_job_still_reads_the_job_with_the_pipeline_lease_answers() -> None:
    """WakeableWorker answers run_job's first pipeline from what LEASE read, through its ``pool``
    property: an arq whose run_job reads anything else there must fail here."""
    assert queue.ARQ_PRIVATE_SURFACE["arq.worker.Worker properties overridden"] == ("pool",)
    assert isinstance(inspect.getattr_static(arq.worker.Worker, "pool"), property)
    source = inspect.getsource(arq.worker.Worker.run_job)
    missing = [s for s in queue.ARQ_PRIVATE_SURFACE["arq.worker.Worker.run_job statements"] if s not in source]
    assert missing == []


def test_the_job_layout_the_api_writes_is_the_one_arq_reads() -> None:
    assert queue.ARQ_PRIVATE_SURFACE["arq.constants"] == ("job_key_prefix", "in_progress_key_prefix",
                                                          "retry_key_prefix")
    assert arq.constants.job_key_prefix == jobs.ARQ_JOB_KEY_PREFIX
    assert arq.constants.in_progress_key_prefix == jobs.ARQ_IN_PROGRESS_KEY_PREFIX
    assert arq.constants.retry_key_prefix == jobs.ARQ_RETRY_KEY_PREFIX
    payload = msgpack_encoder.encode(ExecutionJob(execution_id="exec_1", tool="t", arguments=b"{}"))
    raw = jobs.encode_job(payload, 1_700_000_000_123)
    function, args, kwargs, job_try, enqueue_ms = arq.jobs.deserialize_job_raw(raw, deserializer=queue.deserialize)
    assert (function, list(args), kwargs, job_try, enqueue_ms) == (jobs.FUNCTION, [payload], {}, 1, 1_700_000_000_123)
    assert sorted(queue.deserialize(raw)) == sorted(queue.ARQ_PRIVATE_SURFACE["arq.jobs.deserialize_job_raw fields"])


async def test_a_pipeline_of_run_job_other_than_the_one_pinned_fails_loudly() -> None:
    """The pipeline answered from the lease serves exactly run_job's first pipeline: a key or TTL
    arq did not ask for before is a change of arq, not something to answer wrongly."""
    lease = Lease("exec_1", 0, "w/t/exec_1", b"job", 1)
    pipe = queue._AnsweredPipeline(lease)
    # arq asks by its own names, which never reach Redis (the store's are in the partition's slot).
    pipe.get(jobs.ARQ_JOB_KEY_PREFIX + "exec_1")
    pipe.incr(jobs.ARQ_RETRY_KEY_PREFIX + "exec_1")
    pipe.expire(jobs.ARQ_RETRY_KEY_PREFIX + "exec_1", queue._ARQ_RETRY_TTL_S)
    assert await pipe.execute() == [b"job", 1, True]
    for ask in (lambda: pipe.get(jobs.ARQ_JOB_KEY_PREFIX + "exec_2"), lambda: pipe.incr(jobs.job_key("exec_1")),
                lambda: pipe.expire(jobs.ARQ_RETRY_KEY_PREFIX + "exec_1", 60)):
        with pytest.raises(RuntimeError, match="ARQ_PRIVATE_SURFACE"):
            ask()


def test_a_jobs_payload_reaches_run_job_as_bytes_with_a_short_repr() -> None:
    # arq's run_job reprs its arguments for a log line on every job: of a 1 MiB payload that
    # was a fifth of the worker's CPU (bench/README.md, "Cost curves").
    from carmy_worker.runtime.queue import deserialize, serialize

    payload = bytes(range(256)) * 4096  # 1 MiB
    job = deserialize(serialize({"t": 1, "f": "run", "a": [payload], "k": {}, "et": 0}))
    [arg] = job["a"]
    assert arg == payload and isinstance(arg, bytes)
    assert repr(arg) == "<payload of 1048576 bytes>"
