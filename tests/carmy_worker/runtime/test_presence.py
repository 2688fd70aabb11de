"""What a worker publishes about itself: its tools, an id that names its process, and its heartbeat's
choice of a full check or one of its losses only."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any, cast

import pytest
import redis as sync_redis
import redis.asyncio

from carmy_worker import Context, RetryPolicy, Toolbox
from carmy_worker.runtime.presence import FULL_EVERY, Presence, describe, new_worker_id, pid_of
from carmy_worker.runtime.runner import Runtime
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import keys
from carmy_worker.store.janitor import Janitor
from carmy_worker.store.roster import Beat, Liveness, SyncLiveness
from carmy_worker.wire import WorkerInfo, msgpack_encoder, worker_info_decoder
from tests.holds import Holds
from tests.support import RedisServer, wait_until_async


def test_each_tools_retry_policy_is_published() -> None:
    box = Toolbox()
    patient = RetryPolicy(max_attempts=9, backoff=2.5, max_backoff=60)

    @box.tool(effect="write", retry=patient)
    def sync(ctx: Context) -> None:
        """Sync, tried again up to nine times."""

    @box.tool(effect="read")
    def look(ctx: Context) -> None:
        """Look, with the default policy."""

    described = describe(list(box), WorkerSettings())
    assert [(t.spec.name, t.retry) for t in described] == [("look", RetryPolicy()), ("sync", patient)]
    info = WorkerInfo(worker_id="w", started_ms=0, tools=described, group="g")
    assert worker_info_decoder.decode(msgpack_encoder.encode(info)).tools[1].retry == patient


def test_a_worker_id_names_its_process() -> None:
    assert pid_of(new_worker_id()) == os.getpid()
    assert pid_of("build-host-7-42-a1b2c3") == 42  # a host name with dashes
    assert pid_of("w") is None and pid_of("") is None and pid_of("host-x1-a1b2c3") is None


def beat_until(done: threading.Event, redis_server: RedisServer, runtime: Holds, worker_id: str) -> bool:
    """Run ``worker_id``'s heartbeat thread, a beat every 10 ms, until ``done`` (or 30 s: False)."""
    settings = WorkerSettings(redis_url=redis_server.url, heartbeat=0.01)
    info = WorkerInfo(worker_id=worker_id, started_ms=0, tools=[], group="g")
    presence = Presence(redis=redis.asyncio.Redis.from_url(redis_server.url), settings=settings, info=info,
                        runtime=cast("Runtime", runtime))
    presence._loop = asyncio.new_event_loop()
    thread = threading.Thread(target=presence._beat, daemon=True)
    thread.start()
    try:
        return done.wait(30)
    finally:
        presence._stop.set()
        thread.join(10)
        presence._loop.close()


def test_nine_beats_in_ten_read_only_the_losses_and_any_doubt_sends_a_full_one(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The heartbeat thread's choice, beat by beat: a full check first and one in FULL_EVERY,
    and at once after the runtime may have left a stray, after a beat that failed, and after one
    that met another Redis (another epoch). What happens at each beat is done from inside the
    beat itself (the thread's own order: no race with the test)."""
    kinds: list[str] = []
    done = threading.Event()
    runtime = Holds()
    full_check, losses_check = SyncLiveness.heartbeat, SyncLiveness.check_losses
    doubt_at = FULL_EVERY + 1  # a losses beat, right after the periodic full one

    def heartbeat(self: SyncLiveness, worker_id: str, **kw: Any) -> Beat:
        kinds.append("full")
        return full_check(self, worker_id, **kw)

    def check_losses(self: SyncLiveness, worker_id: str, *, epochs: list[str], **kw: Any) -> Beat:
        kinds.append("losses")
        n = len(kinds) - 1
        if n == doubt_at:
            runtime.unsure = True  # a SETTLE failed meanwhile, say
        if n == doubt_at + 2:
            raise sync_redis.ConnectionError("the beat's connection dropped")
        if n == doubt_at + 4:
            epochs = ["0" * 40 + "/" + "0" * 40] * len(epochs)  # as after a restart or a failover
        if n >= doubt_at + 6:
            done.set()
        return losses_check(self, worker_id, epochs=epochs, **kw)

    monkeypatch.setattr(SyncLiveness, "heartbeat", heartbeat)
    monkeypatch.setattr(SyncLiveness, "check_losses", check_losses)
    assert beat_until(done, redis_server, runtime, "w-cadence"), kinds
    periodic = ["full", *["losses"] * (FULL_EVERY - 1), "full"]
    assert kinds[:doubt_at + 7] == [*periodic, "losses", "full", "losses", "full", "losses", "full", "losses"]
    assert runtime.unsure is False


def test_a_full_beat_takes_what_was_admitted_while_it_was_out_for_neither_a_stray_nor_an_orphan(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A LEASE answered while a full beat is out claims an execution the beat's snapshot did not
    name: Redis lists it as running on the worker and leased to it, and the beat's scan finds it.
    It is the worker's, so it neither needs a second full beat to confirm it nor is released.
    A lease the worker was never told of (a LEASE whose reply was lost) still does: the next beat
    is full, and releases it."""
    worker = "w-admits"
    kinds: list[str] = []
    done = threading.Event()
    runtime = Holds()
    r = sync_redis.Redis.from_url(redis_server.url)
    admitted, lost = keys.new_execution_id(), keys.new_execution_id()
    full_check, losses_check = SyncLiveness.heartbeat, SyncLiveness.check_losses

    def listed(exec_id: str, *, running: bool) -> None:
        partition = keys.partition_of(exec_id)
        r.hset(keys.leases(worker, partition), exec_id, f"token-{exec_id}")
        if running:
            r.hset(keys.execution(exec_id), mapping={"state": "running", "attempt": 1, "worker": worker,
                                                     "tool": "t"})
            r.sadd(keys.running(worker, partition), exec_id)

    def heartbeat(self: SyncLiveness, worker_id: str, **kw: Any) -> Beat:
        kinds.append("full")
        if len(kinds) == 1:  # claimed and leased by a LEASE answered while this beat is out
            listed(admitted, running=True)
            runtime.admit(admitted)
        if len(kinds) == 3:  # leased by a LEASE whose reply never came
            listed(lost, running=False)
        return full_check(self, worker_id, **kw)

    def check_losses(self: SyncLiveness, worker_id: str, **kw: Any) -> Beat:
        kinds.append("losses")
        if len(kinds) == 2:  # its run ended; then something makes the next beat a full one
            partition = keys.partition_of(admitted)
            r.srem(keys.running(worker, partition), admitted)
            r.hdel(keys.leases(worker, partition), admitted)
            runtime.unsure = True
        if len(kinds) >= 5:
            done.set()
        return losses_check(self, worker_id, **kw)

    monkeypatch.setattr(SyncLiveness, "heartbeat", heartbeat)
    monkeypatch.setattr(SyncLiveness, "check_losses", check_losses)
    try:
        assert beat_until(done, redis_server, runtime, worker), kinds
    finally:
        r.close()
    assert kinds[:5] == ["full", "losses", "full", "full", "losses"]
    assert not sync_redis.Redis.from_url(redis_server.url).hexists(keys.leases(worker, keys.partition_of(lost)), lost)


async def test_a_check_that_has_answered_holds_no_step_back_before_its_waiters_woke(redis_server: RedisServer) -> None:
    """``ensure_fresh``'s check answers in its thread, and its future is done in the event loop
    a turn before the steps that wait for it wake. A step that asks in that turn may go: handed
    the done check again, it would find it answered, ask again, and never let the loop turn."""
    presence = Presence(redis=redis.asyncio.Redis.from_url(redis_server.url),
                        settings=WorkerSettings(redis_url=redis_server.url),
                        info=WorkerInfo(worker_id="w", started_ms=0, tools=[], group="g"),
                        runtime=cast("Runtime", Holds()))
    try:
        presence.last_beat = time.monotonic() - 60  # a worker that was paused
        waited = presence.ensure_fresh()
        assert waited is not None, "no check went out"
        presence._check_thread.submit(lambda: None).result(10)  # the check has answered, in its thread
        await asyncio.sleep(0)  # its future is done now; what waits for it is woken next turn
        assert presence._checking is not None and presence._checking.done() and not asyncio.ensure_future(waited).done()
        assert presence.ensure_fresh() is None
        await waited
    finally:
        presence.close()


async def test_the_checks_client_connects_at_registration_and_closes_at_departure(redis_server: RedisServer) -> None:
    """``ensure_fresh``'s client is connected when the worker registers (on one Redis, a
    ``PING``), so that its first check need not connect, and closed when the worker departs:
    a worker that stops leaves no connection of it behind in Redis."""
    store = redis.asyncio.Redis.from_url(redis_server.url)
    admin = redis_server.client()
    presence = Presence(redis=store, settings=WorkerSettings(redis_url=redis_server.url),
                        info=WorkerInfo(worker_id="w-connects", started_ms=0, tools=[], group="g"),
                        runtime=cast("Runtime", Holds()))

    def pinged() -> int:  # the clients whose last command was a PING: the check's
        return sum(c["cmd"] == "ping" for c in admin.client_list())

    try:
        assert pinged() == 0
        await presence.register()
        await asyncio.wrap_future(presence._check_thread.submit(lambda: None))  # behind the connect
        assert pinged() == 1
        await presence.deregister()
        await wait_until_async(lambda: pinged() == 0, 10, "the check's connection closed")
    finally:
        admin.close()
        await store.aclose()


@pytest.mark.usefixtures("four_partitions")
async def test_a_workers_group_is_listed_in_every_partition_before_its_info_is_written(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The info is how any other process learns a worker's group, and routes calls to its queues:
    by then every partition lists the group, so a queue no worker serves any more is always one
    the janitor knows of (store/groups.py)."""
    admin = redis_server.client()
    admin.flushall()
    store = redis.asyncio.Redis.from_url(redis_server.url)
    listed: list[bool] = []
    register = Liveness.register

    async def written(self: Liveness, worker_id: str, info: bytes) -> None:
        listed.extend(admin.zscore(keys.groups(p), "g-listed") is not None for p in keys.partitions())
        await register(self, worker_id, info)

    monkeypatch.setattr(Liveness, "register", written)
    presence = Presence(redis=store, settings=WorkerSettings(redis_url=redis_server.url),
                        info=WorkerInfo(worker_id="w-listed", started_ms=0, tools=[], group="g-listed"),
                        runtime=cast("Runtime", Holds()))
    try:
        await presence.register()
        assert listed == [True] * 4
        await presence.deregister()
    finally:
        admin.close()
        await store.aclose()


class Killed(Exception):
    """The worker's process, killed where this is raised."""


async def test_a_worker_killed_right_after_writing_its_info_is_forgotten_with_it(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's info is written once the worker is in the roster: killed right after (before
    any other beat), it is a departed worker to the janitor, which forgets its info with it (an
    hour on: a janitor that forgets at once here). Written first, the info of a worker killed
    before its first beat was in no roster, and no janitor ever deleted it."""
    admin = redis_server.client()
    admin.flushall()
    store = redis.asyncio.Redis.from_url(redis_server.url)
    register = Liveness.register

    async def killed(self: Liveness, worker_id: str, info: bytes) -> None:
        await register(self, worker_id, info)
        raise Killed

    monkeypatch.setattr(Liveness, "register", killed)
    presence = Presence(redis=store, settings=WorkerSettings(redis_url=redis_server.url),
                        info=WorkerInfo(worker_id="w-killed", started_ms=0, tools=[], group="g"),
                        runtime=cast("Runtime", Holds()))
    try:
        with pytest.raises(Killed):
            await presence.register()
        assert admin.exists(keys.worker("w-killed"))
        await Janitor(store, retention=600, dead_after=3.0, memory=0).sweep()
        assert not admin.exists(keys.worker("w-killed"))
        assert admin.zscore(keys.workers(0), "w-killed") is None
    finally:
        presence.close()
        admin.close()
        await store.aclose()
