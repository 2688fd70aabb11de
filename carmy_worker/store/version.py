"""The Redis the store needs: 7.0 or newer, whose scripts say what they may do over
``maxmemory`` (``store.lua``'s flags). An older Redis cannot even compile them, and would fail
every call with a Lua syntax error: a worker refuses to start on one, saying why, and the API's
``/ready`` says so (``store.memory`` reads the version with the memory)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from carmy_worker.settings import SettingsError

MINIMUM = (7, 0)


class RedisTooOld(SettingsError):
    """The Redis at the configured URL is older than ``MINIMUM``."""


def version_of(info: dict[str, Any]) -> tuple[int, ...] | None:
    """``redis_version`` of an ``INFO`` reply, as numbers; None if it has none."""
    raw = info.get("redis_version")
    if raw is None:
        return None
    try:
        return tuple(int(part) for part in str(raw).split(".")[:2])
    except ValueError:
        return None


def too_old(version: tuple[int, ...] | None) -> bool:
    return version is not None and version < MINIMUM


def message(version: tuple[int, ...]) -> str:
    return (f"Redis {'.'.join(map(str, version))} is older than {'.'.join(map(str, MINIMUM))}, which Carmy needs "
            "(its scripts declare what they may do over maxmemory): upgrade Redis (or Valkey 7.2+)")


async def server_version(redis: Redis) -> tuple[int, ...] | None:
    """The server's version (major, minor), or None if it will not say (an ACL without INFO)."""
    try:
        return version_of(await redis.info("server"))
    except ResponseError:
        return None


async def require(redis: Redis) -> None:
    """``RedisTooOld`` if the server is older than ``MINIMUM``. A server that refuses ``INFO`` (an
    ACL) is taken on trust."""
    version = await server_version(redis)
    if version is not None and too_old(version):
        raise RedisTooOld(message(version))
