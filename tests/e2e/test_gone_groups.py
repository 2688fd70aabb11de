"""A deploy that changes a tool's definition makes a new group of workers with queues of its own
(runtime/presence.py, group_of), and the old group's workers stop. Calls queued to the old group
and settled without running (TIMEOUT) stay answered, and the old group's queues and wake lists go
once no worker has served it for the janitor's memory (store/groups.py): a janitor of the test's
own forgets after seconds, where the processes' forget after an hour."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable

import httpx
import redis
import redis.asyncio

from carmy_worker.store import jobs, keys
from carmy_worker.store.groups import RECHECK_S
from carmy_worker.store.janitor import Janitor
from tests.support import Call, Proc, RedisServer, Stack, wait_until

MEMORY_S = 5.0  # the test's janitor's: past a live worker's beats (every second), well short of an hour


def group_of_the_only_worker(r: redis.Redis) -> str:
    """The group every partition lists once the first worker has beaten."""
    (group,) = wait_until(lambda: r.zrange(keys.groups(0), 0, -1), what="the worker's group listed")  # type: ignore[misc]
    return bytes(group).decode()


def paused_just_after_a_beat(r: redis.Redis, worker: Proc, worker_id: bytes) -> None:
    """SIGSTOP right after a heartbeat: the API counts the worker alive for its next 3 s."""
    last = r.zscore(keys.workers(0), worker_id)
    wait_until(lambda: r.zscore(keys.workers(0), worker_id) != last, what="a fresh heartbeat")
    worker.signal(signal.SIGSTOP)


def the_group_is_gone(r: redis.Redis, group: str) -> bool:
    return not any(r.exists(jobs.queue_name(group, p), jobs.wake_list(jobs.queue_name(group, p)))
                   or r.zscore(keys.groups(p), group) is not None for p in keys.partitions())


async def sweeping_until(janitor: Janitor, done: Callable[[], bool], what: str, within: float) -> None:
    """Sweeps of the test's own janitor (its memory seconds, not an hour) until ``done()``."""
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {within:g} s"
        await janitor.sweep()
        await asyncio.sleep(0.2)


async def test_a_deploys_old_group_keeps_its_answers_and_loses_its_queues(
        fresh_stack: Stack, sync_redis: redis.Redis, redis_server: RedisServer) -> None:
    stack, r = fresh_stack, sync_redis
    old = stack.worker()
    _, base = stack.api({"CARMY_QUEUE_TIMEOUT": "1"})
    wait_until(lambda: "linger" in httpx.get(base + "/agent/tools").text)
    old_group = group_of_the_only_worker(r)
    (worker_id,) = r.zrange(keys.workers(0), 0, -1)

    client = redis.asyncio.Redis.from_url(redis_server.url)
    janitor = Janitor(client, retention=86400, dead_after=3.0, memory=MEMORY_S)
    try:
        paused_just_after_a_beat(r, old, worker_id)
        calls = [Call(base, {"tool": "linger", "arguments": {"seconds": 0.1, "tag": f"late-{n}"}}) for n in range(2)]
        # The paused worker's BLPOP, sent before the pause, may still take one call (Redis runs the
        # LEASE that goes with it): REAP then puts it back in the old group's queue, where no worker
        # will take it, and it is answered once its queue timeout has passed again, from then.
        await sweeping_until(janitor, lambda: all(not call.is_alive() for call in calls), "the calls answered", 30)
        answers = [call.result() for call in calls]
        assert [a.status_code for a in answers] == [504, 504], [a.text for a in answers]
        ids = [a.json()["execution_id"] for a in answers]
        # Settled by the janitor, and left in the old group's queue for a claim that will not come.
        for exec_id in ids:
            assert r.zscore(jobs.queue_name(old_group, keys.partition_of(exec_id)), exec_id) is not None

        old.kill()
        stack.worker(env={"CARMY_DEFAULT_TIMEOUT": "31"})  # the deploy: a definition changed, a new group
        wait_until(lambda: r.zcard(keys.groups(0)) == 2, what="the new group listed")
        # Every entry is settled by the time the group is gone: its first look takes them all out.
        # (An execution still queued then would be settled there, and its entry go at the group's
        # next look, a minute on: groups.RECHECK_S.)
        await sweeping_until(janitor, lambda: the_group_is_gone(r, old_group), "the old group's queues gone",
                             RECHECK_S + 30)
    finally:
        await client.aclose()
    for exec_id in ids:  # the answers stay, for their retention
        body = httpx.get(f"{base}/agent/executions/{exec_id}").json()
        assert body["status"] == "timed_out" and body["error"]["code"] == "TIMEOUT", body
