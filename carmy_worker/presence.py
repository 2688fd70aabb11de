"""A worker's presence in Redis: what it serves, and that it is still alive.

The heartbeat runs in its own thread with its own connection, so a tool that hogs the event
loop does not make a live worker look dead; a killed or paused process stops it at once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import uuid

import redis as sync_redis
from redis.asyncio import Redis

from carmy_worker import keys, scripts
from carmy_worker.settings import WorkerSettings
from carmy_worker.toolbox import Tool
from carmy_worker.wire import WorkerInfo, WorkerTool, msgpack_encoder

log = logging.getLogger("carmy.worker")


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
    """Registers a worker, keeps its heartbeat, and deregisters it on a clean stop."""

    def __init__(self, *, redis: Redis, settings: WorkerSettings, info: WorkerInfo) -> None:
        self.redis = redis
        self.settings = settings
        self.info = info
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    async def register(self) -> None:
        heartbeat = self.redis.register_script(scripts.HEARTBEAT)
        await self.redis.set(keys.worker(self.info.worker_id), msgpack_encoder.encode(self.info))
        await heartbeat(keys=[keys.WORKERS], args=[self.info.worker_id, 0])
        await self.redis.publish(keys.CATALOG_CHANNEL, self.info.worker_id)
        self._thread = threading.Thread(target=self._beat, name="carmy-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        client = sync_redis.Redis.from_url(self.settings.redis_url, socket_timeout=2, socket_connect_timeout=2)
        heartbeat = client.register_script(scripts.HEARTBEAT)
        was_down = False
        while not self._stop.wait(self.settings.heartbeat):
            try:
                heartbeat(keys=[keys.WORKERS], args=[self.info.worker_id, 0])
                if was_down:  # Redis came back, maybe empty: say again who we are
                    client.set(keys.worker(self.info.worker_id), msgpack_encoder.encode(self.info))
                    client.publish(keys.CATALOG_CHANNEL, self.info.worker_id)
                    log.info("heartbeat restored")
                was_down = False
            except sync_redis.RedisError as exc:
                if not was_down:
                    log.warning("heartbeat failed: %s", exc)
                was_down = True
        client.close()

    async def deregister(self) -> None:
        """Mark this worker departed (its tools are remembered a while, as unavailable)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        heartbeat = self.redis.register_script(scripts.HEARTBEAT)
        offset = -int(self.settings.dead_after * 1000) - 1
        await heartbeat(keys=[keys.WORKERS], args=[self.info.worker_id, offset])
        await self.redis.publish(keys.CATALOG_CHANNEL, self.info.worker_id)
