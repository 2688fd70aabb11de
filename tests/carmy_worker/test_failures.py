"""A loop's failures, told once an episode (carmy_worker.failures)."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from carmy_worker.failures import Failures


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def told(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "test.loop"]


def test_an_outage_is_told_once_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    failures = Failures("job loop", logging.getLogger("test.loop"), clock=clock)
    with caplog.at_level(logging.INFO, "test.loop"):
        for _ in range(30):  # 30 passes a second apart: well under the reminder's minute
            failures.failed(RedisConnectionError("Connection refused."))
            clock.now += 1
        failures.worked()
        failures.worked()  # nothing more to tell
    assert told(caplog) == [("WARNING", "job loop: Connection refused."),
                            ("INFO", "job loop: working again after 30.0 s")]


def test_another_kind_of_error_is_told_at_once_and_a_long_one_again_each_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    failures = Failures("janitor sweep", logging.getLogger("test.loop"), clock=clock)
    with caplog.at_level(logging.INFO, "test.loop"):
        failures.failed(RedisConnectionError("Connection refused."))
        clock.now += 1
        failures.failed(KeyError("state"))  # a bug beside the outage is not hidden by it
        for _ in range(130):
            clock.now += 1
            failures.failed(KeyError("state"))
    assert told(caplog) == [
        ("WARNING", "janitor sweep: Connection refused."),
        ("WARNING", "janitor sweep: 'state' (failing for 1 s)"),
        ("WARNING", "janitor sweep: 'state' (failing for 61 s)"),
        ("WARNING", "janitor sweep: 'state' (failing for 121 s)"),
    ]


def test_a_new_episode_is_told_from_its_start(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    failures = Failures("callback loop", logging.getLogger("test.loop"), clock=clock)
    with caplog.at_level(logging.INFO, "test.loop"):
        failures.failed(RedisConnectionError("down"))
        clock.now += 2
        failures.worked()
        clock.now += 10
        failures.failed(RedisConnectionError("down"))
    assert told(caplog) == [("WARNING", "callback loop: down"),
                            ("INFO", "callback loop: working again after 2.0 s"),
                            ("WARNING", "callback loop: down")]
