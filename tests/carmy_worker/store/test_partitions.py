"""Partitions: an execution is found from its id alone, a replay in the partition of its request
id, every key of an execution in one slot; and processes that disagree on the count refuse to
start against a store that recorded another."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from api.app import create_app
from api.settings import ApiSettings
from carmy_worker.settings import SettingsError, WorkerSettings
from carmy_worker.store import jobs, keys, partitions
from tests import cells
from tests.support import ROOT, RedisServer, app_settings


@pytest.fixture
def sixteen() -> Iterator[int]:
    with cells.partitions(16) as count:
        yield count


def slot(key: str) -> int:
    return key_slot(key.encode())


@pytest.mark.usefixtures("sixteen")
def test_an_id_drawn_for_a_partition_lands_there_and_stays_a_random_uuid4() -> None:
    for partition in range(16):
        for _ in range(20):
            exec_id = keys.new_execution_id(partition)
            assert keys.is_execution_id(exec_id) and keys.partition_of(exec_id) == partition
            parsed = uuid.UUID(exec_id.removeprefix("exec_"))
            assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
        assert keys.partition_of(keys.new_job_id(partition)) == partition
    drawn = {keys.partition_of(keys.new_execution_id()) for _ in range(2000)}
    assert drawn == set(range(16))  # undirected ids spread over every partition


@pytest.mark.usefixtures("sixteen")
def test_every_key_of_an_execution_is_in_its_partitions_slot() -> None:
    for partition in range(16):
        exec_id = keys.new_execution_id(partition)
        names = [keys.execution(exec_id), keys.record(exec_id), jobs.job_key(exec_id), jobs.in_progress_key(exec_id),
                 jobs.retry_key(exec_id)]
        assert all(f"{{c:{partition}}}" in name for name in names)
        assert {slot(name) for name in names} == {slot(keys.partition_prefix(partition))}


@pytest.mark.usefixtures("sixteen")
def test_a_request_ids_key_and_its_execution_share_a_slot() -> None:
    for n in range(200):
        principal, session, request_id = f"p{n % 7}", None if n % 2 else "s", f"req-{n}"
        partition = keys.request_partition(principal, session, request_id)
        assert partition is not None
        exec_id = keys.new_execution_id(partition)
        assert slot(keys.idempotency(principal, session, request_id)) == slot(keys.execution(exec_id))
    assert keys.request_partition("p", None, None) is None  # no request id: any partition
    slots = {slot(keys.partition_prefix(p)) for p in range(16)}
    assert len(slots) == 16  # sixteen slots, not one


@pytest.fixture
def one() -> Iterator[int]:
    with cells.partitions(1) as count:
        yield count


@pytest.mark.usefixtures("one")
def test_one_partition_names_every_key_in_partition_zero() -> None:
    exec_id = keys.new_execution_id(0)
    assert keys.execution(exec_id) == f"carmy:{{c:0}}:exe:{exec_id}"
    assert keys.request_partition("p", None, "r") == 0
    assert keys.partition_of(exec_id) == 0


def test_the_setting_is_one_partition_on_one_redis_and_sixteen_on_a_cluster() -> None:
    assert WorkerSettings.from_env({}).redis_partitions == ApiSettings.from_env({}).redis_partitions == 1
    cluster = {"CARMY_REDIS_CLUSTER_NODES": "127.0.0.1:7000"}
    assert WorkerSettings.from_env(cluster).redis_partitions == ApiSettings.from_env(cluster).redis_partitions == 16
    assert WorkerSettings.from_env({**cluster, "CARMY_REDIS_PARTITIONS": "4"}).redis_partitions == 4
    assert ApiSettings.from_env({"CARMY_REDIS_PARTITIONS": "1"}).redis_partitions == 1
    for bad in ("0", "17", "x"):
        with pytest.raises(SettingsError, match="CARMY_REDIS_PARTITIONS"):
            WorkerSettings.from_env({"CARMY_REDIS_PARTITIONS": bad})


@pytest.fixture
async def ar(sync_redis: redis.Redis, redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    sync_redis.flushall()
    client = redis.asyncio.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()
    sync_redis.flushall()


async def test_the_first_process_records_the_count_and_another_count_is_refused(ar: redis.asyncio.Redis) -> None:
    await partitions.agree(ar, 4)
    await partitions.agree(ar, 4)  # the same count: the next process starts
    with pytest.raises(partitions.PartitionsDisagree, match="is 16 here but 4 in Redis"):
        await partitions.agree(ar, 16)
    assert await ar.get(keys.PARTITIONS) == b"4"


async def test_an_api_configured_with_another_count_does_not_start(ar: redis.asyncio.Redis,
                                                                   redis_server: RedisServer) -> None:
    here = keys.partition_count()  # CARMY_REDIS_PARTITIONS of this run (app_settings follows it)
    await partitions.agree(ar, here + 3)  # as a deployment of another count would have recorded it
    app = create_app(app_settings(redis_server.url))
    with pytest.raises(partitions.PartitionsDisagree, match=f"is {here} here but {here + 3} in Redis"):
        async with app.router.lifespan_context(app):
            pass


@pytest.mark.slow
async def test_python_m_api_with_another_count_says_why_in_a_line(ar: redis.asyncio.Redis,
                                                                   redis_server: RedisServer) -> None:
    """As the worker does: the message alone, status 2, no traceback of the app's start-up."""
    here = keys.partition_count()
    await partitions.agree(ar, here + 3)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARMY_")}
    env.update({"CARMY_REDIS_URL": redis_server.url, "CARMY_REDIS_PARTITIONS": str(here), "CARMY_PORT": "0"})
    started = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "api"], env=env, cwd=ROOT,
                                      capture_output=True, text=True, timeout=60)
    assert started.returncode == 2
    assert started.stderr.strip().splitlines() == [
        f"api: CARMY_REDIS_PARTITIONS is {here} here but {here + 3} in Redis ({keys.PARTITIONS}, written by the "
        f"first process of this deployment): set it to {here + 3} on every API and worker (changing it needs an "
        "empty Redis: executions are found by their partition)"]
