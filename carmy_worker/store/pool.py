"""A bounded connection pool that tells "busy" from "down".

A burst of calls queues for the pool's connections: that must make calls slower, never answer
them as if Redis were gone. And when Redis is gone, callers must hear it at once, not after
queueing behind connections that are failing one by one.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from typing import Any

from redis.asyncio import BlockingConnectionPool
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from carmy_worker.store.checkout import QuickCheckout
from carmy_worker.store.patience import LoopClock
from carmy_worker.store.pubsub import raise_if_cancelled


class StoreUnreachable(ConnectionError):
    """The last attempt to connect to Redis failed; nobody waits for a connection meanwhile."""


class _Waiter:
    """One caller in the queue: the connection it is handed, and when it began to wait."""

    __slots__ = ("future", "since")

    def __init__(self, future: asyncio.Future[AbstractConnection], since: float) -> None:
        self.future = future
        self.since = since


class StorePool(QuickCheckout, BlockingConnectionPool):
    """A ``BlockingConnectionPool`` whose callers wait their turn for a free connection, up to
    ``timeout`` seconds of the loop's time (``LoopClock``) while Redis is reachable, and not at
    all while it is not.

    First come, first served: a caller that finds others waiting queues behind them, and a
    released connection goes straight to the oldest waiter. The wait does not count the time the
    event loop ran late: a process busy with thousands of requests is not an unavailable store.
    The same goes for opening a connection: one that timed out while the loop was late is tried
    again instead of marking Redis unreachable.

    A failed attempt to connect marks Redis unreachable: every caller waiting is woken and
    refused (``StoreUnreachable``), and so is any later caller that would have to wait. A
    caller that finds a connection free still tries it, so the first connection that succeeds
    ends the outage. How long "unreachable" takes to tell is the connection's own timeouts
    (``socket_connect_timeout``), not the wait.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unreachable: RedisError | OSError | None = None
        self._waiters: deque[_Waiter] = deque()
        self._clock = LoopClock(on_tick=self._expire)

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> AbstractConnection:
        if self._waiters or not self.can_get_connection():
            if self.unreachable is not None:
                raise StoreUnreachable(f"Redis is unreachable: {self.unreachable}")
            connection = await self._wait_turn()
        else:
            connection = self.get_available_connection()  # type: ignore[no-untyped-call]
        try:
            await self._connect(connection)
        except BaseException:
            await self.release(connection)
            raise
        return connection

    async def release(self, connection: AbstractConnection) -> None:
        """Back to the pool, or straight to the oldest caller waiting."""
        await super(BlockingConnectionPool, self).release(connection)
        self._hand_over()

    async def _wait_turn(self) -> AbstractConnection:
        waiter = _Waiter(asyncio.get_running_loop().create_future(), self._clock.now())
        self._clock.hold()
        self._waiters.append(waiter)
        try:
            return await waiter.future
        except BaseException:
            future = waiter.future
            if future.done() and not future.cancelled() and future.exception() is None:
                await self.release(future.result())  # handed over as this caller left: pass it on
            raise
        finally:
            self._clock.let_go()
            if not waiter.future.done() or waiter.future.cancelled():  # left the queue by itself
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    async def _connect(self, connection: AbstractConnection) -> None:
        fresh = not connection.is_connected
        self._clock.hold()
        try:
            started = self._clock.now()
            while True:
                began = self._clock.now()
                try:
                    await self.ensure_connection(connection)
                    break
                except RedisTimeoutError as exc:
                    # redis-py may turn the caller's cancellation into a timeout: never retry that.
                    raise_if_cancelled(exc)
                    # A timeout the loop's lateness made (the reply was there, the timer ran
                    # first) is tried again, within the caller's patience.
                    now, patience = self._clock.now(), math.inf if self.timeout is None else self.timeout
                    if now - began >= _shortest_timeout(connection) or now - started >= patience:
                        self._mark_unreachable(exc)
                        raise
                except (RedisError, OSError) as exc:
                    raise_if_cancelled(exc)  # one caller's cancellation is no outage for the others
                    self._mark_unreachable(exc)
                    raise
        finally:
            self._clock.let_go()
        if fresh:
            self.unreachable = None

    def _hand_over(self) -> None:
        while self._waiters and self.can_get_connection():
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_result(self.get_available_connection())  # type: ignore[no-untyped-call]

    def _expire(self) -> None:
        """Refuse the callers that waited their whole ``timeout`` (the oldest are first)."""
        if self.timeout is None:
            return
        now = self._clock.now()
        while self._waiters and (self._waiters[0].future.done() or now - self._waiters[0].since >= self.timeout):
            future = self._waiters.popleft().future
            if not future.done():
                future.set_exception(ConnectionError(f"No connection available within {self.timeout:g} s."))

    def _mark_unreachable(self, exc: RedisError | OSError) -> None:
        self.unreachable = exc
        while self._waiters:
            future = self._waiters.popleft().future
            if not future.done():
                future.set_exception(StoreUnreachable(f"Redis is unreachable: {exc}"))


def _shortest_timeout(connection: AbstractConnection) -> float:
    """The shortest of the timeouts that may end an attempt to connect (and say hello)."""
    timeouts = [getattr(connection, name, None) for name in ("socket_connect_timeout", "socket_timeout")]
    return min((t for t in timeouts if t), default=0.0)
