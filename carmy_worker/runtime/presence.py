"""A worker's presence in Redis: what it serves, that it is alive, and whether it still takes
work.

The heartbeat runs in its own thread with its own connection, so a tool that hogs the event
loop does not make a live worker look dead; a killed or paused process stops it at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable

import redis as sync_redis
from redis.asyncio import Redis

from carmy_worker.runtime.runner import Runtime
from carmy_worker.sdk.toolbox import Tool
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import keys
from carmy_worker.store.roster import Beat, Liveness, Stray, SyncLiveness
from carmy_worker.wire import WorkerInfo, WorkerTool, msgpack_encoder

log = logging.getLogger("carmy.worker")

RETRY_S = 0.2  # between heartbeats while Redis does not answer


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def describe(tools: list[Tool], settings: WorkerSettings) -> list[WorkerTool]:
    return [
        WorkerTool(spec=t.spec, timeout=t.timeout or settings.default_timeout)
        for t in sorted(tools, key=lambda t: t.name)
    ]


def group_of(described: list[WorkerTool]) -> str:
    """Workers serving exactly the same tools share a queue: its name is their digest."""
    return hashlib.sha256(msgpack_encoder.encode(described)).hexdigest()[:16]


class Presence:
    """Registers a worker, keeps its heartbeat, and deregisters it on a clean stop.

    Each heartbeat also checks what the worker's runtime holds. An execution the worker lost
    (the janitor reaped it while the worker was paused or cut off from Redis) is stopped at
    once; so is one whose tool lock went to another. One listed as running on this worker that
    the runtime does not hold, on two heartbeats in a row, is a stray (a reply that never came,
    or a write Redis lost): it is reaped like a dead worker's, so it never stays unsettled.
    """

    def __init__(self, *, redis: Redis, settings: WorkerSettings, info: WorkerInfo, runtime: Runtime) -> None:
        self.redis = redis
        self.settings = settings
        self.info = info
        self.runtime = runtime
        self._info_key = keys.worker(info.worker_id)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._liveness = Liveness(redis, dead_after=settings.dead_after)
        self._on_continue: SyncLiveness | None = None

    async def register(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self.redis.set(self._info_key, msgpack_encoder.encode(self.info))
        await self._liveness.heartbeat(self.info.worker_id)
        await self.redis.publish(keys.CATALOG_CHANNEL, self.info.worker_id)
        self._thread = threading.Thread(target=self._beat, name="carmy-heartbeat", daemon=True)
        self._thread.start()

    def continued(self) -> None:
        """On SIGCONT, in the event loop, before any tool takes another step: the process was
        stopped, and may have lost executions meanwhile. Check now, blocking for one round trip,
        rather than at the next heartbeat."""
        if self._on_continue is None:
            client = sync_redis.Redis.from_url(self.settings.redis_url, socket_timeout=1, socket_connect_timeout=1)
            self._on_continue = SyncLiveness(client, dead_after=self.settings.dead_after)
        try:
            self._check(self._on_continue, lambda fn, *args: fn(*args))
        except sync_redis.RedisError as exc:
            log.warning("could not check this worker's executions after it was continued: %s", exc)

    def _check(self, liveness: SyncLiveness, call: Callable[..., object]) -> Beat:
        held = self.runtime.holdings()
        beat = liveness.heartbeat(self.info.worker_id, held=held)
        attempts = {h.execution_id: h.attempt for h in held}
        for exec_id in beat.lost:
            call(self.runtime.lose, exec_id, attempts[exec_id], "it was given to another attempt")
        for exec_id in beat.unlocked:
            call(self.runtime.unlock, exec_id, attempts[exec_id])
        return beat

    def _beat(self) -> None:
        assert self._loop is not None
        loop = self._loop
        client = sync_redis.Redis.from_url(self.settings.redis_url, socket_timeout=2, socket_connect_timeout=2)
        liveness = SyncLiveness(client, dead_after=self.settings.dead_after)
        failing = False
        suspects: set[Stray] = set()
        interval = self.settings.heartbeat
        while not self._stop.wait(interval):
            try:
                beat = self._check(liveness, loop.call_soon_threadsafe)
                if not beat.registered:
                    # Redis came back empty: say again who we are.
                    client.set(self._info_key, msgpack_encoder.encode(self.info))
                    client.publish(keys.CATALOG_CHANNEL, self.info.worker_id)
                    log.info("registered again after Redis lost this worker")
                strays = set(beat.strays)
                for stray in strays & suspects:
                    asyncio.run_coroutine_threadsafe(self.runtime.reap_stray(stray), loop)
                suspects = strays - suspects
                if failing:
                    log.info("heartbeat restored")
                failing = False
                interval = self.settings.heartbeat
            except sync_redis.RedisError as exc:
                if not failing:
                    log.warning("heartbeat failed: %s", exc)
                failing = True
                # Retry soon: once Redis is back, a live worker must say so before it is judged.
                interval = min(self.settings.heartbeat, RETRY_S)
        client.close()

    async def drain(self) -> None:
        """Stop being offered new work; keep heartbeating for what still runs."""
        await self.redis.sadd(keys.DRAINING, self.info.worker_id)  # type: ignore[misc]  # redis-py's union
        await self.redis.publish(keys.CATALOG_CHANNEL, self.info.worker_id)

    async def deregister(self) -> None:
        """Mark this worker departed (its tools are remembered a while, as unavailable)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        offset = -int(self.settings.dead_after * 1000) - 1
        await self._liveness.heartbeat(self.info.worker_id, offset_ms=offset)

        await self.redis.srem(keys.DRAINING, self.info.worker_id)  # type: ignore[misc]  # redis-py's union
        await self.redis.publish(keys.CATALOG_CHANNEL, self.info.worker_id)
