"""Cron expressions: what is refused, when occurrences fall (in a timezone, across DST changes),
and what a schedule that fell behind fires and skips, in bounded time."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from croniter import croniter

from carmy_worker.jobs import cron as cron_module
from carmy_worker.jobs.cron import Cron, CronError, Firing, due

SECOND, MINUTE, HOUR = 1000, 60_000, 3_600_000


def ms(iso: str) -> int:
    """Unix ms of an ISO 8601 time with its offset."""
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


def utc(at: int) -> str:
    return datetime.fromtimestamp(at / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def walk(cron: Cron, start: str, n: int) -> list[str]:
    """The first ``n`` occurrences after ``start``, in UTC."""
    return [utc(at) for at in itertools.islice(cron.occurrences_after(ms(start)), n)]


# --- refused ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("expr", "problem"), [
    ("", "has 0 fields"),
    ("* * * *", "has 4 fields"),
    ("0 0 * * * * 2024", "has 7 fields"),  # croniter's years
    ("@reboot", "the @ forms are @hourly"),
    ("@midnight", "the @ forms are"),
    ("61 * * * *", "out of range"),
    ("* * * * 8", "out of range"),
    ("*/0 * * * *", "step '0'"),
    ("a b c d e", "not acceptable"),
    ("0 0 30 2 *", "can never occur"),
    ("R * * * *", "'R' is drawn at random or hashed"),
    ("H/5 * * * *", "'H/5' is drawn at random or hashed"),
    ("0 0 * * *\u00a0*", "only ASCII"),  # a no-break space: croniter would read 5 fields, str.split 6
    ("* * * * *" + " " * 192, "at most 200 characters, not 201"),
])
def test_bad_expressions_are_refused(expr: str, problem: str) -> None:
    with pytest.raises(CronError, match=problem):
        Cron.parse(expr)


@pytest.mark.parametrize("zone", ["Nowhere/City", "europe/lisbon", "Europe", "../etc/passwd", "", "zone.tab"])
def test_unknown_timezones_are_refused(zone: str) -> None:
    with pytest.raises(CronError, match=f"timezone {zone!r} is not an IANA timezone name"):
        Cron.parse("* * * * *", zone)


def test_the_hosts_own_timezone_is_refused() -> None:
    with pytest.raises(CronError, match="'localtime' is the host's own"):
        Cron.parse("* * * * *", "localtime")


def test_non_strings_are_refused() -> None:
    with pytest.raises(CronError, match="must be a string, not int"):
        Cron.parse(5)  # type: ignore[arg-type]
    with pytest.raises(CronError, match="a timezone must be a string, not NoneType"):
        Cron.parse("* * * * *", None)  # type: ignore[arg-type]


# --- accepted ---------------------------------------------------------------------------------


def test_two_hundred_characters_are_accepted() -> None:
    assert Cron.parse("* * * * *" + " " * 191).next_after(ms("2024-01-01T00:00:00+00:00")) == ms(
        "2024-01-01T00:01:00+00:00")


def test_next_after_is_strictly_after() -> None:
    cron = Cron.parse("*/15 * * * *")
    assert cron.next_after(ms("2024-01-01T00:15:00+00:00")) == ms("2024-01-01T00:30:00+00:00")
    assert cron.next_after(ms("2024-01-01T00:15:00+00:00") - 1) == ms("2024-01-01T00:15:00+00:00")
    assert cron.next_after(ms("2024-01-01T00:15:00+00:00") + 1) == ms("2024-01-01T00:30:00+00:00")


def test_a_leading_seconds_field() -> None:
    # second 30 of 12:00 each day; with croniter's default (seconds last) it would be 00:30 on
    # the 12th of each month, every second.
    assert walk(Cron.parse("30 0 12 * * *"), "2024-01-01T00:00:00+00:00", 2) == [
        "2024-01-01 12:00:30", "2024-01-02 12:00:30"]
    every_15s = Cron.parse("*/15 * * * * *")
    assert every_15s.next_after(ms("2024-01-01T00:00:00.500+00:00")) == ms("2024-01-01T00:00:15+00:00")
    assert every_15s.next_after(ms("2024-01-01T00:00:14.999+00:00")) == ms("2024-01-01T00:00:15+00:00")


def test_aliases() -> None:
    start = "2024-05-15T10:20:00+00:00"
    for alias, fields in cron_module.ALIASES.items():
        assert walk(Cron.parse(alias.upper()), start, 3) == walk(Cron.parse(fields), start, 3)
    assert walk(Cron.parse("@weekly"), start, 1) == ["2024-05-19 00:00:00"]  # a Sunday


def test_occurrences_fall_in_the_timezone() -> None:
    assert walk(Cron.parse("0 9 * * mon", "America/New_York"), "2024-01-01T00:00:00+00:00", 1) == [
        "2024-01-01 14:00:00"]


def test_a_daily_time_across_both_dst_changes_in_lisbon() -> None:
    """03:00 local every day: 03:00 UTC in winter (WET), 02:00 UTC in summer (WEST)."""
    cron = Cron.parse("0 3 * * *", "Europe/Lisbon")
    assert walk(cron, "2024-03-29T12:00:00+00:00", 4) == [
        "2024-03-30 03:00:00", "2024-03-31 02:00:00", "2024-04-01 02:00:00", "2024-04-02 02:00:00"]
    assert walk(cron, "2024-10-25T12:00:00+00:00", 3) == [
        "2024-10-26 02:00:00", "2024-10-27 03:00:00", "2024-10-28 03:00:00"]


def test_the_hour_skipped_in_spring_fires_once_after_the_gap() -> None:
    """Lisbon, 2024-03-31: 01:00 WET becomes 02:00 WEST. Every quarter of hour 1 falls in the gap."""
    cron = Cron.parse("*/15 1 * * *", "Europe/Lisbon")
    assert walk(cron, "2024-03-30T12:00:00+00:00", 3) == [
        "2024-03-31 01:00:00",  # 02:00 WEST, once
        "2024-04-01 00:00:00", "2024-04-01 00:15:00"]  # 01:00 and 01:15 WEST


def test_the_hour_repeated_in_autumn_fires_on_both_passes() -> None:
    """Lisbon, 2024-10-27: 02:00 WEST becomes 01:00 WET, so 01:30 happens twice."""
    assert walk(Cron.parse("30 1 * * *", "Europe/Lisbon"), "2024-10-26T12:00:00+00:00", 3) == [
        "2024-10-27 00:30:00", "2024-10-27 01:30:00", "2024-10-28 01:30:00"]


def test_a_year_of_local_hours_is_every_hour_once() -> None:
    """Lisbon's offsets are whole hours, so its local hours, through the hour skipped in spring
    and the hour repeated in autumn, are every UTC hour: none left out, none twice."""
    start = ms("2024-01-01T00:00:00+00:00")
    hours = itertools.islice(Cron.parse("0 * * * *", "Europe/Lisbon").occurrences_after(start), 366 * 24)
    assert list(hours) == [start + n * HOUR for n in range(1, 366 * 24 + 1)]


class Stutter(croniter):  # type: ignore[misc]  # croniter has no annotations
    """A croniter that answers its first occurrence twice: a step back, as a DST bug would."""

    calls = 0

    def get_next(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 2:
            return self.get_current(float)
        return super().get_next(*args, **kwargs)


def test_occurrences_never_step_back_even_if_croniter_does(monkeypatch: pytest.MonkeyPatch) -> None:
    cron = Cron.parse("*/10 * * * *")
    monkeypatch.setattr(cron_module, "croniter", Stutter)
    assert walk(cron, "2024-01-01T00:05:00+00:00", 3) == [
        "2024-01-01 00:10:00", "2024-01-01 00:20:00", "2024-01-01 00:30:00"]


# --- due --------------------------------------------------------------------------------------

T0 = ms("2024-06-01T12:00:00+00:00")
EVERY_MINUTE = Cron.parse("* * * * *")


def test_nothing_is_due_before_next() -> None:
    assert due(EVERY_MINUTE, T0, T0 - 1, 60 * SECOND) == Firing([], 0, T0)


def test_on_time() -> None:
    assert due(EVERY_MINUTE, T0, T0, 60 * SECOND) == Firing([T0], 0, T0 + MINUTE)
    assert due(EVERY_MINUTE, T0, T0 + 59 * SECOND, 60 * SECOND) == Firing([T0], 0, T0 + MINUTE)


def test_late_occurrences_are_skipped_and_the_recent_ones_fired() -> None:
    now = T0 + 10 * MINUTE + 5 * SECOND
    firing = due(EVERY_MINUTE, T0, now, 3 * MINUTE)
    # 12:00 to 12:10 are due; those at most 3 minutes late (12:08, 12:09, 12:10) fire.
    assert firing == Firing([T0 + 8 * MINUTE, T0 + 9 * MINUTE, T0 + 10 * MINUTE], 8, T0 + 11 * MINUTE)


def test_the_grace_is_inclusive() -> None:
    firing = due(EVERY_MINUTE, T0, T0 + 2 * MINUTE, MINUTE)
    assert firing == Firing([T0 + MINUTE, T0 + 2 * MINUTE], 1, T0 + 3 * MINUTE)


def test_beyond_the_limit_occurrences_are_skipped() -> None:
    firing = due(EVERY_MINUTE, T0, T0 + 10 * MINUTE, HOUR, limit=4)
    assert firing == Firing([T0, T0 + MINUTE, T0 + 2 * MINUTE, T0 + 3 * MINUTE], 7, T0 + 11 * MINUTE)


def test_in_a_timezone_next_is_the_local_occurrence() -> None:
    daily = Cron.parse("0 3 * * *", "Europe/Lisbon")
    firing = due(daily, ms("2024-03-30T03:00:00+00:00"), ms("2024-03-31T02:00:30+00:00"), MINUTE)
    assert firing == Firing([ms("2024-03-31T02:00:00+00:00")], 1, ms("2024-04-01T02:00:00+00:00"))


def test_a_long_outage_counts_up_to_the_cap_then_jumps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A per-second schedule down for a year: 31 million occurrences missed, counted up to the
    cap only, and the ones within the grace still fire."""
    monkeypatch.setattr(cron_module, "MAX_COUNTED", 1000)
    every_second = Cron.parse("* * * * * *")
    now = T0 + 400
    started = time.monotonic()
    firing = due(every_second, T0 - 365 * 24 * HOUR, now, 5 * SECOND)
    assert time.monotonic() - started < 1
    assert firing == Firing([T0 - 4 * SECOND + s * SECOND for s in range(5)], 1000, T0 + SECOND)


def test_the_cap_holds_past_the_limit_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cron_module, "MAX_COUNTED", 5)
    every_second = Cron.parse("* * * * * *")
    firing = due(every_second, T0 - 100 * SECOND, T0, 50 * SECOND, limit=10)
    # 5 of the 50 too late counted, 10 of the 51 in the grace fired, the other 41 not counted.
    assert firing == Firing([T0 - 50 * SECOND + s * SECOND for s in range(10)], 5, T0 + SECOND)


@pytest.mark.slow
def test_a_long_outage_takes_bounded_time() -> None:
    """Every minute, down ten years: five million occurrences, MAX_COUNTED of them counted."""
    started = time.monotonic()
    firing = due(EVERY_MINUTE, T0 - 3653 * 24 * HOUR, T0 + 30 * SECOND, 90 * SECOND)
    assert time.monotonic() - started < 20
    assert firing == Firing([T0 - MINUTE, T0], cron_module.MAX_COUNTED, T0 + MINUTE)
