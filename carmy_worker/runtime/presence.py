"""A worker's presence in Redis: what it serves, that it is alive, and whether it still takes
work.

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

from carmy_worker.sdk.toolbox import Tool
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import keys
from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.roster import Liveness, SyncLiveness
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

    def __init__(self, *, redis: Redis, settings: WorkerSettings, info: WorkerInfo,
                 connector: RedisConnector | None = None) -> None:
        self.redis = redis
        self.settings = settings
        self.connector = connector or RedisConnector(settings.redis_url)
        self.info = info
        self._info_key = keys.worker(info.worker_id)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._liveness = Liveness(redis)

    async def register(self) -> None:
        await self.redis.set(self._info_key, msgpack_encoder.encode(self.info))
        await self._liveness.heartbeat(self.info.worker_id)
        await self.redis.publish(keys.CATALOG_CHANNEL, self.info.worker_id)
        self._thread = threading.Thread(target=self._beat, name="carmy-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        client = self.connector.sync_client(socket_timeout=2, socket_connect_timeout=2)
        liveness = SyncLiveness(client)
        failing = False
        while not self._stop.wait(self.settings.heartbeat):
            try:
                if not liveness.heartbeat(self.info.worker_id):
                    # Redis came back empty: say again who we are.
                    client.set(self._info_key, msgpack_encoder.encode(self.info))
                    client.publish(keys.CATALOG_CHANNEL, self.info.worker_id)
                    log.info("registered again after Redis lost this worker")
                if failing:
                    log.info("heartbeat restored")
                failing = False
            except sync_redis.RedisError as exc:
                if not failing:
                    log.warning("heartbeat failed: %s", exc)
                failing = True
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
