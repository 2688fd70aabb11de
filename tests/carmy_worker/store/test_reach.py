"""``store.reach``: a partition whose call failed is left alone for a while and tried again after
it, the others go on; on one Redis an error is the caller's, as before."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import pytest
from redis.exceptions import AskError, MovedError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from carmy_worker.store.reach import MOVED_PAUSE_S, RETRY_AFTER_S, Reach
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
        assert reach.reachable(2) and not reach.answers(2)  # to be tried again; it has not answered yet
        assert await reach.run(2, refused(calls, 2)) is None  # tried again, and down again
        clock.now += 1.0
        assert await reach.run(2, answered(calls, 2)) == "p2"
        assert not reach.any_down and reach.partitions() == [0, 1, 2, 3] and reach.answers(2)
    assert calls == [2, 1, 2, 2]
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if "partition 2 unreachable" in m]) == 1  # once per outage
    assert len([m for m in lines if "partition 2 answers again" in m]) == 1


async def test_on_one_redis_the_error_is_the_callers() -> None:
    reach = Reach("loop", logging.getLogger("carmy.jobs"), clock=Clock())
    with partitions(1), pytest.raises(RedisConnectionError):
        await reach.run(0, refused([], 0))


@pytest.mark.parametrize("refusal", [MovedError("25 127.0.0.1:7001"), AskError("25 127.0.0.1:7001"),
                                     TryAgainError("Multiple keys request during rehashing of slot")])
async def test_a_partition_whose_slot_moved_is_tried_again_at_once_and_not_called_unreachable(
        refusal: Exception, caplog: pytest.LogCaptureFixture) -> None:
    """A redirection is no outage: nothing ran, the slot table is reloaded, and the partition is
    tried again after MOVED_PAUSE_S rather than RETRY_AFTER_S, without a warning."""
    clock, calls = Clock(), list[int]()

    async def redirected() -> str:
        calls.append(2)
        raise refusal

    reach = Reach("worker", logging.getLogger("carmy.queue"), clock=clock)
    with partitions(4), caplog.at_level(logging.INFO, logger="carmy.queue"):
        assert await reach.run(2, redirected) is None
        assert not reach.reachable(2)  # not in the same breath: the table is reloaded first
        clock.now += MOVED_PAUSE_S
        assert await reach.run(2, redirected) is None  # a migration's TRYAGAIN, again
        clock.now += MOVED_PAUSE_S
        assert await reach.run(2, answered(calls, 2)) == "p2"
    assert calls == [2, 2, 2] and MOVED_PAUSE_S < RETRY_AFTER_S / 10
    assert not caplog.records  # neither "unreachable" nor "answers again"


async def test_an_outage_then_a_moved_slot_is_told_once_each_way(caplog: pytest.LogCaptureFixture) -> None:
    """A failover's connection error, then MOVED to the promoted replica: one warning, and one
    line when the partition answers again."""
    clock = Clock()

    async def moved() -> str:
        raise MovedError("25 127.0.0.1:7004")

    reach = Reach("job loop", logging.getLogger("carmy.jobs"), clock=clock)
    with partitions(4), caplog.at_level(logging.INFO, logger="carmy.jobs"):
        await reach.run(1, refused([], 1))
        clock.now += RETRY_AFTER_S
        await reach.run(1, moved)
        clock.now += MOVED_PAUSE_S
        assert await reach.run(1, answered([], 1)) == "p1"
    lines = [r.getMessage() for r in caplog.records]
    assert [m.split(" (")[0] for m in lines] == ["job loop: partition 1 unreachable",
                                                 "job loop: partition 1 answers again"]


async def test_a_slot_redirected_for_a_second_on_end_is_an_outage(caplog: pytest.LogCaptureFixture) -> None:
    """A slot table that stays wrong is not retried 20 times a second, unlogged, for ever."""
    clock = Clock()

    async def moved() -> str:
        raise MovedError("25 127.0.0.1:7004")

    reach = Reach("worker", logging.getLogger("carmy.queue"), clock=clock)
    with partitions(4), caplog.at_level(logging.INFO, logger="carmy.queue"):
        while clock.now < 100.0 + RETRY_AFTER_S:
            await reach.run(3, moved)
            clock.now += MOVED_PAUSE_S
        assert not caplog.records
        await reach.run(3, moved)
        clock.now += MOVED_PAUSE_S
        assert not reach.reachable(3)  # paused for RETRY_AFTER_S now
        assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["worker: partition 3 unreachable"]
