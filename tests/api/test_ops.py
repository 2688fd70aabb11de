"""``/ready`` and ``/metrics`` on Redis's memory, through the in-process app against a Redis of
the module's own: full (maxmemory below what it holds), and one whose ACL refuses INFO; and
``/metrics`` over four partitions, every one counted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
import redis
import redis.asyncio

from carmy_worker.store import keys
from carmy_worker.store.roster import Liveness
from carmy_worker.store.submit import Submit
from carmy_worker.store.verdicts import Verdicts
from carmy_worker.wire import ExecutionJob, WorkerInfo, msgpack_encoder
from tests.conftest import app_client
from tests.support import RedisServer, app_settings


def metric(text: str, name: str) -> float:
    [value] = [line.split()[1] for line in text.splitlines() if line.startswith(name + " ")]
    return float(value)


def labelled(text: str, name: str, label: str) -> float:
    """The sum of ``name``'s samples whose labels include ``label`` (``key="value"``)."""
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name + "{") and label in line.split("}")[0])


async def test_a_full_redis_makes_the_api_not_ready_and_says_why(
        own_redis_server: RedisServer, own_redis: redis.Redis) -> None:
    async with app_client(app_settings(own_redis_server.url, redis_memory_headroom=0.5)) as client:
        ready = (await client.get("/ready")).json()
        assert ready["checks"]["redis"] == {"ok": True}
        assert ready["checks"]["memory"]["ok"] is True and ready["checks"]["memory"]["limit_bytes"] == 0
        used = ready["checks"]["memory"]["used_bytes"]
        own_redis.config_set("maxmemory", used + used // 2)  # two thirds of it taken, over the half
        answer = await client.get("/ready")
        assert answer.status_code == 503
        memory = answer.json()["checks"]["memory"]
        assert memory["ok"] is False and memory["error"]["code"] == "STORE_FULL"
        assert memory["admit_below_bytes"] == (used + used // 2) - (used + used // 2) // 2
        text = (await client.get("/metrics")).text
        assert metric(text, "carmy_redis_memory_full") == 1
        assert metric(text, "carmy_redis_memory_limit_bytes") == used + used // 2
        assert metric(text, "carmy_api_store_full_refusals_total") == 0  # no call was refused yet


async def test_a_redis_that_refuses_info_is_still_ready(own_redis_server: RedisServer, own_redis: redis.Redis) -> None:
    own_redis.acl_setuser("no-info", enabled=True, passwords=["+secret"], keys=["*"], channels=["*"],
                          commands=["+@all", "-info"])
    try:
        url = f"redis://no-info:secret@127.0.0.1:{own_redis_server.port}/0"
        async with app_client(app_settings(url)) as client:
            answer: httpx.Response = await client.get("/ready")
            checks = answer.json()["checks"]
            assert checks["redis"] == {"ok": True}
            assert "memory" not in checks  # unknown, not failing: admission falls back on Redis's own limit
            assert checks["workers"]["ok"] is False  # none here
            assert "carmy_redis_memory_full" not in (await client.get("/metrics")).text
    finally:
        own_redis.acl_deluser("no-info")


async def scrape_until(client: httpx.AsyncClient, test: Callable[[str], bool], timeout: float = 10.0) -> str:
    """``/metrics`` scraped until its text passes ``test``."""
    deadline = time.monotonic() + timeout
    while not test(text := (await client.get("/metrics")).text):
        if time.monotonic() > deadline:
            raise TimeoutError(f"/metrics never passed the test; last:\n{text}")
        await asyncio.sleep(0.05)
    return text


@pytest.fixture
def four_partitions(own_redis: redis.Redis) -> Iterator[None]:
    """A Redis of the module's own (the count is recorded in it), and every key named over four
    partitions for the test (the app names them so too, in this process)."""
    before = keys.partition_count()
    own_redis.flushall()
    try:
        yield
    finally:
        keys.use_partitions(before)
        own_redis.flushall()


@pytest.mark.usefixtures("four_partitions")
@pytest.mark.slow
async def test_metrics_count_the_executions_of_every_partition(own_redis_server: RedisServer) -> None:
    async with app_client(app_settings(own_redis_server.url, redis_partitions=4)) as client:
        ar = redis.asyncio.Redis.from_url(own_redis_server.url)
        try:
            liveness = Liveness(ar, dead_after=3.0)
            info = WorkerInfo(worker_id="w-cells", started_ms=0, tools=[], group="g", host="h", pid=1)
            await liveness.register(info.worker_id, msgpack_encoder.encode(info))
            await liveness.heartbeat(info.worker_id)
            for partition in keys.partitions():  # two accepted in each, one of them then cancelled
                ids = [keys.new_execution_id(partition) for _ in range(2)]
                for exec_id in ids:
                    await Submit(ar, retention=600)(
                        ExecutionJob(execution_id=exec_id, tool="tally", arguments=b"{}"), group="g",
                        idempotent=True, workers_alive=True, max_pending=100, queue_wait_ms=60_000,
                        admission_ms=60_000)
                assert await Verdicts(ar, retention=600).cancel(ids[0], "tally") == "cancelled"

            # The catalog counts the worker at its next refresh.
            text = await scrape_until(client, lambda t: "carmy_workers_live 1.0" in t.splitlines())
            assert metric(text, "carmy_queue_depth") == 4
            assert metric(text, "carmy_pending_executions") == 4
            assert labelled(text, "carmy_executions_total", 'status="cancelled"') == 4
            assert metric(text, "carmy_workers_live") == 1
        finally:
            await ar.aclose()
