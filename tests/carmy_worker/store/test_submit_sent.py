"""``Submit.send`` with ``track``: ``Pending.written`` says when the SUBMIT has left for Redis,
which the API begins an SSE stream on (docs/architecture.md, section 4, step 3)."""

from __future__ import annotations

import asyncio

import redis.asyncio

from carmy_worker.store import keys
from carmy_worker.store.submit import Pending, Submit
from carmy_worker.wire import ExecutionJob

RETENTION = 600


def new_job() -> ExecutionJob:
    return ExecutionJob(execution_id=keys.new_execution_id(), tool="t", arguments=b"{}")


async def warm(submit: Submit) -> None:
    """Until Redis has run SUBMIT on the batch's connection (a first one may have been loaded and
    run through another)."""
    for _ in range(2):
        assert (await send(submit, new_job())).kind == "new"


def send(submit: Submit, job: ExecutionJob, *, track: bool = True) -> Pending:
    return submit.send(job, group="g", idempotent=False, workers_alive=True, max_pending=100,
                       queue_wait_ms=60_000, admission_ms=60_000, track=track)


async def test_written_once_the_submit_has_left_and_the_execution_is_there_for_whoever_asks_next(
        ar: redis.asyncio.Redis) -> None:
    submit = Submit(ar, retention=RETENTION)
    await warm(submit)
    job = new_job()
    pending = send(submit, job)
    assert await pending.written()
    # Asked on another connection after it was written, before its reply was read.
    assert await ar.hget(keys.execution(job.execution_id), "state") == b"queued"
    assert (await pending).kind == "new"


async def test_not_written_first_on_a_connection_redis_has_not_run_submit_on() -> None:
    """The first SUBMIT of a batch's connection may be refused NOSCRIPT and sent again later:
    its reply comes first."""
    from tests.support import private_redis  # a Redis that has never seen SUBMIT

    with private_redis() as server:
        client = redis.asyncio.Redis.from_url(server.url)
        try:
            pending = send(Submit(client, retention=RETENTION), new_job())
            assert not await pending.written()
            assert (await pending).kind == "new"
        finally:
            await client.aclose()


async def test_a_caller_cancelled_before_the_submit_left_never_sends_it(ar: redis.asyncio.Redis) -> None:
    """As a caller cancelled while awaiting its SUBMIT: here, while the batch opens its
    connection (its first call), so nothing has been written yet."""
    submit = Submit(ar, retention=RETENTION)
    job = new_job()
    waiting = asyncio.ensure_future(send(submit, job).written())
    await asyncio.sleep(0)  # the batch has begun opening its connection, and the caller waits
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert waiting.cancelled()
    await warm(submit)  # later calls go out on that connection, and are answered
    assert not await ar.exists(keys.execution(job.execution_id))
