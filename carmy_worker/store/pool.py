"""A bounded connection pool that tells "busy" from "down".

A burst of calls queues for the pool's connections: that must make calls slower, never answer
them as if Redis were gone. And when Redis is gone, callers must hear it at once, not after
queueing behind connections that are failing one by one.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import BlockingConnectionPool
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError, RedisError


class StoreUnreachable(ConnectionError):
    """The last attempt to connect to Redis failed; nobody waits for a connection meanwhile."""


class StorePool(BlockingConnectionPool):
    """A ``BlockingConnectionPool`` whose callers wait for a free connection up to ``timeout``
    seconds while Redis is reachable, and not at all while it is not.

    A failed attempt to connect marks Redis unreachable: every caller waiting is woken and
    refused (``StoreUnreachable``), and so is any later caller that would have to wait. A
    caller that finds a connection free still tries it, so the first connection that succeeds
    ends the outage. How long "unreachable" takes to tell is the connection's own timeouts
    (``socket_connect_timeout``), not the wait.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unreachable: RedisError | OSError | None = None

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> AbstractConnection:
        try:
            async with self._condition:
                async with asyncio.timeout(self.timeout):
                    await self._condition.wait_for(self._may_go_on)
                if not self.can_get_connection():
                    raise StoreUnreachable(f"Redis is unreachable: {self.unreachable}")
                connection: AbstractConnection = self.get_available_connection()  # type: ignore[no-untyped-call]
        except TimeoutError as exc:
            raise ConnectionError(f"No connection available within {self.timeout:g} s.") from exc
        fresh = not connection.is_connected
        try:
            await self.ensure_connection(connection)
        except (RedisError, OSError) as exc:
            await self.release(connection)
            await self._mark_unreachable(exc)
            raise
        except BaseException:
            await self.release(connection)
            raise
        if fresh:
            self.unreachable = None
        return connection

    def _may_go_on(self) -> bool:
        return bool(self.can_get_connection()) or self.unreachable is not None

    async def _mark_unreachable(self, exc: RedisError | OSError) -> None:
        async with self._condition:
            self.unreachable = exc
            self._condition.notify_all()
