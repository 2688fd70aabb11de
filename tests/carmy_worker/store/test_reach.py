"""``store.reach``: a partition whose call failed is left alone for a while and tried again after
it, the others go on; on one Redis an error is the caller's, as before."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from carmy_worker.store.reach import Reach
from tests.cells import partitions


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def refused(calls: list[int], partition: int) -> Callable[[], Awaitable[str]]:
    async def work() -> str:
        calls.append(partition)
        raise RedisConnectionError("Connection refused")
    return work


def answered(calls: list[int], partition: int) -> Callable[[], Awaitable[str]]:
    async def work() -> str:
        calls.append(partition)
        return f"p{partition}"
    return work


async def test_a_failed_partition_is_paused_then_tried_again(caplog: pytest.LogCaptureFixture) -> None:
    clock, calls = Clock(), list[int]()
    reach = Reach("loop", logging.getLogger("carmy.jobs"), retry_after_s=1.0, clock=clock)
    with partitions(4), caplog.at_level(logging.INFO, logger="carmy.jobs"):
        assert await reach.run(2, refused(calls, 2)) is None
        assert await reach.run(1, answered(calls, 1)) == "p1"  # the others go on
        assert reach.any_down and reach.partitions() == [0, 1, 3]
        assert await reach.run(2, answered(calls, 2)) is None  # paused: not even tried
        assert calls == [2, 1]
        clock.now += 1.0
        assert await reach.run(2, refused(calls, 2)) is None  # tried again, and down again
        clock.now += 1.0
        assert await reach.run(2, answered(calls, 2)) == "p2"
        assert not reach.any_down and reach.partitions() == [0, 1, 2, 3]
    assert calls == [2, 1, 2, 2]
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if "partition 2 unreachable" in m]) == 1  # once per outage
    assert len([m for m in lines if "partition 2 answers again" in m]) == 1


async def test_on_one_redis_the_error_is_the_callers() -> None:
    reach = Reach("loop", logging.getLogger("carmy.jobs"), clock=Clock())
    with partitions(1), pytest.raises(RedisConnectionError):
        await reach.run(0, refused([], 0))
