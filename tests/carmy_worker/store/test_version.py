"""The Redis the store needs: 7.0 or newer (its scripts' flags), checked at a worker's start and
by the API's /ready; the real server here passes, an older one is refused by name."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio
from redis.exceptions import ResponseError

from carmy_worker.store import version


class Answers:
    """A client whose INFO says what it is told (a Redis 6 cannot be had here)."""

    def __init__(self, info: dict[str, Any] | Exception) -> None:
        self._info = info

    async def info(self, section: str) -> dict[str, Any]:
        assert section == "server"
        if isinstance(self._info, Exception):
            raise self._info
        return self._info


async def test_the_redis_the_tests_run_on_is_new_enough(ar: redis.asyncio.Redis) -> None:
    found = await version.server_version(ar)
    assert found is not None and not version.too_old(found)
    await version.require(ar)


@pytest.mark.parametrize("raw", ["6.2.14", "5.0.7"])
async def test_an_older_redis_is_refused_saying_which_and_why(raw: str) -> None:
    with pytest.raises(version.RedisTooOld, match=rf"Redis {raw[:3]} is older than 7.0, which Carmy needs"):
        await version.require(Answers({"redis_version": raw}))  # type: ignore[arg-type]


@pytest.mark.parametrize("info", [{"redis_version": "7.0.15"}, {"redis_version": "8.2.1"}, {},
                                  ResponseError("NOPERM this user has no permissions to run the 'info' command")])
async def test_a_new_enough_or_silent_redis_is_taken(info: dict[str, Any] | Exception) -> None:
    await version.require(Answers(info))  # type: ignore[arg-type]
