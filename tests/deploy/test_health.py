"""``python -m carmy_worker.health``, the worker container's health check, against real workers."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import redis

from carmy_worker.health import check
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import keys
from carmy_worker.store.roster import SyncLiveness
from carmy_worker.wire import WorkerInfo, msgpack_encoder
from tests.support import ROOT, RedisServer, Stack, free_port, wait_until

DEAD_AFTER = WorkerSettings().dead_after


def health(stack: Stack, redis_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = stack.env({"CARMY_REDIS_URL": redis_url} if redis_url else None)
    return subprocess.run([sys.executable, "-m", "carmy_worker.health"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=15)


@pytest.mark.slow
def test_healthy_while_a_worker_heartbeats_and_unhealthy_once_it_is_dead(stack: Stack) -> None:
    worker = stack.worker()
    alive = health(stack)
    assert alive.returncode == 0, alive.stderr
    assert alive.stderr == ""

    worker.kill()  # SIGKILL: no deregistration, only the heartbeat stops
    checks: list[subprocess.CompletedProcess[str]] = []

    def unhealthy() -> bool:
        checks.append(health(stack))
        return checks[-1].returncode != 0

    # Healthy until its last heartbeat is older than dead_after, then unhealthy.
    wait_until(unhealthy, DEAD_AFTER + 30)
    dead = checks[-1]
    assert all(c.returncode == 0 for c in checks[:-1])
    assert dead.returncode == 1
    assert "no worker on" in dead.stderr
    assert len(dead.stderr.strip().splitlines()) == 1


def test_a_live_worker_on_another_host_does_not_count(stack: Stack, sync_redis: redis.Redis) -> None:
    info = WorkerInfo(worker_id="elsewhere-1", started_ms=0, tools=[], group="g", host="elsewhere", pid=1)
    sync_redis.set(keys.worker(info.worker_id), msgpack_encoder.encode(info))
    SyncLiveness(sync_redis, dead_after=DEAD_AFTER).heartbeat(info.worker_id)
    result = health(stack)
    assert result.returncode == 1
    assert f"no worker on {socket.gethostname()}" in result.stderr
    assert "1 live elsewhere" in result.stderr


@pytest.mark.usefixtures("four_partitions")
def test_a_worker_is_healthy_only_while_alive_in_every_partition(sync_redis: redis.Redis,
                                                                 redis_server: RedisServer) -> None:
    sync_redis.flushall()
    host = socket.gethostname()
    info = WorkerInfo(worker_id="here-1", started_ms=0, tools=[], group="g", host=host, pid=1)
    sync_redis.set(keys.worker(info.worker_id), msgpack_encoder.encode(info))
    SyncLiveness(sync_redis, dead_after=DEAD_AFTER).heartbeat(info.worker_id)
    settings = WorkerSettings(redis_url=redis_server.url, redis_partitions=4)
    assert check(settings, host) is None
    # Its beats no longer reach partition 3 (where the janitor now reaps its work): not healthy.
    seconds, micros = sync_redis.time()
    sync_redis.zadd(keys.workers(3), {info.worker_id: seconds * 1000 + micros // 1000 - 10 * DEAD_AFTER * 1000})
    assert check(settings, host) == (f"worker here-1 on {host} has not heartbeated in the last {DEAD_AFTER:g} s "
                                     "in partition(s) 3 of 4")


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A port that accepts connections and never answers, like a Redis behind a dead network."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"


@pytest.mark.slow
@pytest.mark.parametrize("target", ["refused", "silent"])
def test_unreachable_redis_is_unhealthy_within_seconds(stack: Stack, silent_server: str, target: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0" if target == "refused" else silent_server
    started = time.monotonic()
    result = health(stack, url)
    assert time.monotonic() - started < 5
    assert result.returncode == 1
    assert result.stderr.startswith("carmy_worker.health: cannot query Redis")
