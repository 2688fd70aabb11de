"""Settling what nobody else will: executions whose worker died, and executions that waited in
the queue past their start deadline. Every worker and every API process runs one; the scripts
make concurrent janitors harmless."""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis

from carmy_worker import keys, metrics, queue, records, scripts

log = logging.getLogger("carmy.janitor")

# Tools of a worker that left are still listed (as NO_WORKERS) this long, so a restart or a
# crash does not turn calls into TOOL_NOT_FOUND.
DEPARTED_MEMORY_S = 3600


class Janitor:
    def __init__(self, redis: Redis, *, retention: int, dead_after: float) -> None:
        self.redis = redis
        self.retention = retention
        self.dead_after_ms = int(dead_after * 1000)
        self._scan = redis.register_script(scripts.JANITOR_SCAN)
        self._reap = redis.register_script(scripts.REAP)
        self._expire = redis.register_script(scripts.EXPIRE_UNSTARTED)

    async def run(self, interval: float = 1.0) -> None:
        """Sweep every ``interval`` seconds until cancelled; Redis errors are retried."""
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("janitor sweep failed: %s", exc)
            await asyncio.sleep(interval)

    async def sweep(self) -> int:
        """One pass; returns how many executions it settled or re-queued."""
        held, late = await self._scan(
            keys=[keys.WORKERS, keys.QUEUED, keys.DRAINING],
            args=[self.dead_after_ms, DEPARTED_MEMORY_S * 1000, keys.running(""), keys.execution(""), keys.worker("")],
        )
        acted = 0
        for i in range(0, len(held), 3):
            worker_id, exec_id, tool = (v.decode() for v in held[i:i + 3])
            record = records.uncertain(exec_id, tool, "its worker stopped responding")
            stored, final = records.final_event(record)
            outcome = await self._reap(
                keys=[keys.execution(exec_id), keys.record(exec_id), keys.PENDING, keys.running(worker_id),
                      queue.in_progress_key(exec_id)],
                args=[exec_id, worker_id, stored, self.retention, keys.events(exec_id), final, metrics.label(record)],
            )
            log.warning("execution %s of dead worker %s: %s", exec_id, worker_id, outcome.decode())
            acted += 1
        for i in range(0, len(late), 2):
            exec_id, tool = (v.decode() for v in late[i:i + 2])
            record = records.never_started(exec_id, tool)
            stored, final = records.final_event(record)
            if await self._expire(
                keys=[keys.execution(exec_id), keys.record(exec_id), keys.PENDING, keys.QUEUED],
                args=[exec_id, stored, self.retention, keys.events(exec_id), final, metrics.label(record)],
            ):
                log.warning("execution %s never started before its deadline", exec_id)
                acted += 1
        return acted
