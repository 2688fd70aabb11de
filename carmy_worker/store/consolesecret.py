"""The operator console's signing secret, shared by every API replica through Redis
(``keys.CONSOLE_SECRET``) when ``CARMY_CONSOLE_SECRET`` does not give one."""

from __future__ import annotations

from redis.asyncio import Redis

from carmy_worker.store import keys


async def shared_secret(redis: Redis, candidate: bytes) -> bytes:
    """The secret every replica uses: the one already in Redis, or ``candidate``, written now.

    One command (``SET NX GET``, Redis 7.0+): two replicas starting together cannot each keep
    their own candidate, since Redis writes only the first and answers the second with it.
    """
    found = await redis.set(keys.CONSOLE_SECRET, candidate, nx=True, get=True)
    return bytes(found) if found is not None else candidate
