"""``parallel_safe=False``: at most one execution of a tool at a time, across all workers.

A Redis key holds the attempt that has the tool (``roster.lock_holder``), with a lease the
holder renews while it runs: a holder that crashes loses the tool within ``LEASE_S`` seconds.
A holder that was paused past its lease finds, on waking, that the tool went to another: its
renewal says so (``on_lost``), and so does its worker's next heartbeat. Waiters poll with a
short backoff; their wait counts against their own timeout. The scripts, and the replica
``WAIT``s behind taking it (the lock, in a slot of its own, then BEGIN, in the execution's: it
marks the execution begun), are ``store.locks``'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Literal

from redis.exceptions import RedisError

from carmy_worker.store import keys
from carmy_worker.store.locks import Taken, ToolLocks

log = logging.getLogger("carmy.worker")

LEASE_S = 5.0
_MAX_POLL_S = 0.05


# taken: this attempt has the tool; lost: the attempt is no longer current (take nothing, record
# nothing); timed_out, cancelled: it waited in vain.
Acquired = Literal["taken", "lost", "timed_out", "cancelled"]


class ToolLock:
    """The lock of ``tool`` for one attempt at ``exec_id`` (its scripts: ``store.locks``)."""

    def __init__(self, locks: ToolLocks, tool: str, exec_id: str, attempt: int, *,
                 on_lost: Callable[[], None] | None = None) -> None:
        self.locks = locks
        self.tool = tool
        self.key = keys.lock(tool)
        self.on_lost = on_lost
        self._exec_id = exec_id
        self._attempt = attempt
        self._renewer: asyncio.Task[None] | None = None
        self._unreachable = False  # the last try failed on Redis (logged once)

    async def acquire(self, timeout: float, cancelled: asyncio.Event) -> Acquired:
        """Wait for the tool, at most ``timeout`` seconds, until ``cancelled`` is set."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = 0.002
        lease_ms = int(LEASE_S * 1000)
        while (taken := await self._try(lease_ms)) == "held":
            remaining = deadline - loop.time()
            if cancelled.is_set():
                return "cancelled"
            if remaining <= 0:
                return "timed_out"
            with contextlib.suppress(TimeoutError):  # not wait_for: it can swallow a cancellation (3.11)
                async with asyncio.timeout(min(delay, remaining)):
                    await cancelled.wait()
            delay = min(delay * 2, _MAX_POLL_S)
        if taken == "lost":
            return "lost"
        self._renewer = asyncio.create_task(self._keep(lease_ms))
        return "taken"

    async def _try(self, lease_ms: int) -> Taken:
        # A Redis error here is "not yet": the tool has not begun, so the wait goes on (within
        # its timeout) rather than giving the job back.
        try:
            return await self.locks.take(self.tool, self._exec_id, self._attempt, lease_ms=lease_ms)
        except RedisError as exc:
            if not self._unreachable:
                log.warning("could not take the lock of %s yet (%s); still trying", self.key, exc)
            self._unreachable = True
            return "held"

    async def _keep(self, lease_ms: int) -> None:
        while True:
            await asyncio.sleep(LEASE_S / 3)
            try:
                renewed = await self.locks.renew(self.tool, self._exec_id, self._attempt, lease_ms=lease_ms)
            except RedisError as exc:
                log.warning("could not renew the lock of %s: %s", self.key, exc)
                continue
            if not renewed:
                log.warning("%s/%d lost the lock of %s (its lease ran out)", self._exec_id, self._attempt, self.key)
                if self.on_lost is not None:
                    self.on_lost()
                return

    async def release(self) -> None:
        if self._renewer is not None:
            # Dropped, not kept: the cancelled task's traceback holds this lock through its
            # frame, a cycle that would leave the execution's objects to the garbage collector.
            self._renewer.cancel()
            self._renewer = None
        try:
            await self.locks.release(self.tool, self._exec_id, self._attempt)
        except RedisError as exc:  # the lease runs out by itself
            log.warning("could not release %s: %s", self.key, exc)
