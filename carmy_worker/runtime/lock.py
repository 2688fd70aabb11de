"""``parallel_safe=False``: at most one execution of a tool at a time, across all workers.

A Redis key holds the attempt that has the tool (``roster.lock_holder``), with a lease the
holder renews while it runs: a holder that crashes loses the tool within ``LEASE_S`` seconds.
A holder that was paused past its lease finds, on waking, that the tool went to another: its
renewal says so (``on_lost``), and so does its worker's next heartbeat. Waiters poll with a
short backoff; their wait counts against their own timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Literal

from redis.asyncio import Redis
from redis.exceptions import RedisError

from carmy_worker.store import keys
from carmy_worker.store.roster import lock_holder

log = logging.getLogger("carmy.worker")

LEASE_S = 5.0
_MAX_POLL_S = 0.05

# Takes the tool for one attempt, which then begins its tool: marked in the execution, so that
# a non-idempotent execution whose worker dies while it waits is tried again, not judged
# uncertain. An attempt that is no longer current (its worker was paused while it waited, and
# the execution went to another) takes nothing: -1. Else 1 if taken, 0 if held by another.
# KEYS: lock, exe; ARGV: holder, lease ms, attempt, worker_id
_TAKE = """
local h = redis.call('HMGET', KEYS[2], 'attempt', 'reaped', 'state', 'worker')
if h[1] ~= ARGV[3] or h[2] == ARGV[3] or h[3] ~= 'running' or h[4] ~= ARGV[4] then return -1 end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('HSET', KEYS[2], 'began', ARGV[3])
return 1
"""
# KEYS: lock; ARGV: holder, lease ms. Extends the lease only for its holder.
_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
# KEYS: lock; ARGV: holder. Releases only its own hold.
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


# taken: this attempt has the tool; lost: the attempt is no longer current (take nothing, record
# nothing); timed_out, cancelled: it waited in vain.
Acquired = Literal["taken", "lost", "timed_out", "cancelled"]


class ToolLock:
    """The lock of ``tool`` for one attempt at ``exec_id``."""

    def __init__(self, redis: Redis, tool: str, exec_id: str, attempt: int, *, worker_id: str,
                 on_lost: Callable[[], None] | None = None) -> None:
        self.redis = redis
        self.key = keys.lock(tool)
        self.holder = lock_holder(exec_id, attempt)
        self.on_lost = on_lost
        self._execution = keys.execution(exec_id)
        self._attempt = attempt
        self._worker_id = worker_id
        self._take = redis.register_script(_TAKE)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)
        self._renewer: asyncio.Task[None] | None = None
        self._unreachable = False  # the last try failed on Redis (logged once)

    async def acquire(self, timeout: float, cancelled: asyncio.Event) -> Acquired:
        """Wait for the tool, at most ``timeout`` seconds, until ``cancelled`` is set."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = 0.002
        lease_ms = int(LEASE_S * 1000)
        while (taken := await self._try(lease_ms)) == 0:
            remaining = deadline - loop.time()
            if cancelled.is_set():
                return "cancelled"
            if remaining <= 0:
                return "timed_out"
            with contextlib.suppress(TimeoutError):  # not wait_for: it can swallow a cancellation (3.11)
                async with asyncio.timeout(min(delay, remaining)):
                    await cancelled.wait()
            delay = min(delay * 2, _MAX_POLL_S)
        if taken < 0:
            return "lost"
        self._renewer = asyncio.create_task(self._keep(lease_ms))
        return "taken"

    async def _try(self, lease_ms: int) -> int:
        # A Redis error here is "not yet": the tool has not begun, so the wait goes on (within
        # its timeout) rather than giving the job back.
        try:
            return int(await self._take(keys=[self.key, self._execution], args=[self.holder, lease_ms, self._attempt,
                                                                                     self._worker_id]))
        except RedisError as exc:
            if not self._unreachable:
                log.warning("could not take the lock of %s yet (%s); still trying", self.key, exc)
            self._unreachable = True
            return 0

    async def _keep(self, lease_ms: int) -> None:
        while True:
            await asyncio.sleep(LEASE_S / 3)
            try:
                renewed = await self._renew(keys=[self.key], args=[self.holder, lease_ms])
            except RedisError as exc:
                log.warning("could not renew the lock of %s: %s", self.key, exc)
                continue
            if not renewed:
                log.warning("%s lost the lock of %s (its lease ran out)", self.holder, self.key)
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
            await self._release(keys=[self.key], args=[self.holder])
        except RedisError as exc:  # the lease runs out by itself
            log.warning("could not release %s: %s", self.key, exc)
