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
