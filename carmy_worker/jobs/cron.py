"""When a schedule's occurrences fall: a cron expression read on the wall clock of an IANA
timezone (croniter does the calendar), and which of them a schedule fires, or skips, once it
is due (``due``).

Every time here is unix milliseconds, an int, as the store keeps them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

MAX_LENGTH = 200  # characters of an expression
# The most missed occurrences ``due`` counts one by one: some two to four seconds of croniter.
MAX_COUNTED = 100_000
ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
}
# croniter's R (a value drawn at random: each worker would draw its own) and H (hashed from an
# id): every worker that declares a schedule must compute the same occurrences.
_DRAWN = re.compile(r"[hr](\(.*\))?(/.*)?", re.IGNORECASE)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class CronError(ValueError):
    """A cron expression or timezone that cannot be used; the message names what is wrong."""


@dataclass(frozen=True)
class Cron:
    """A cron expression read in a timezone; build one with ``Cron.parse``.

    Five fields (minute, hour, day of month, month, day of week), or six with a leading seconds
    field, in croniter's syntax: lists, ranges, steps, names (``mon``, ``jan``), ``L``, ``W``,
    ``#`` and ``?``. As in cron, when both day fields are restricted a day matches either one.
    ``@hourly``, ``@daily``, ``@weekly``, ``@monthly`` and ``@yearly`` stand for their five
    fields. Refused: any other ``@`` form (``@reboot``), croniter's seven fields (with years),
    its ``R`` and ``H`` fields, and a day the months named never have (``0 0 30 2 *``).

    Occurrences fall on the wall clock of the timezone, as croniter 7 computes them across DST
    changes. A time the clock skips in spring fires at the first minute after the gap, once
    however many occurrences fell in it: in Europe/Lisbon on 2024-03-31, ``30 1 * * *`` fires
    at 02:00 WEST. A time the clock repeats in autumn fires on both passes: on 2024-10-27,
    ``30 1 * * *`` fires at 01:30 WEST and an hour later at 01:30 WET. A time the changes do
    not touch, such as ``0 3 * * *``, fires once a day at 03:00 whatever the offset.
    """

    expr: str  # as written
    timezone: str  # its IANA name
    zone: ZoneInfo = field(repr=False, compare=False)
    fields: str = field(repr=False, compare=False)  # what croniter reads: an alias spelled out
    seconds: bool = field(repr=False, compare=False)  # six fields, the first one seconds

    @classmethod
    def parse(cls, expr: str, timezone: str = "UTC") -> Cron:
        """``expr`` read in ``timezone`` (an IANA name such as ``Europe/Lisbon``); a
        ``CronError`` naming the problem if either cannot be used."""
        fields = _fields(expr)
        return cls(expr=expr, timezone=timezone, zone=_zone(timezone), fields=" ".join(fields),
                   seconds=len(fields) == 6)

    def next_after(self, ms: int) -> int:
        """The first occurrence strictly after unix time ``ms``."""
        return next(self.occurrences_after(ms))

    def occurrences_after(self, ms: int) -> Iterator[int]:
        """Every occurrence strictly after unix time ``ms``, in order, each later than the last."""
        walk = croniter(self.fields, self._local(ms), second_at_beginning=self.seconds)
        last, nudge = ms, 0
        while True:
            at = round(walk.get_next(float) * 1000)
            if at <= last:
                # Not seen in croniter 7 across some 400 DST changes of a dozen zones; should
                # one of its corner cases step back, go on from past the last occurrence rather
                # than fire one twice or walk in a circle.
                walk.set_current(self._local(last + nudge), force=True)
                nudge += 1000 if self.seconds else 60_000
                continue
            last, nudge = at, 0
            yield at

    def _local(self, ms: int) -> datetime:
        return (_EPOCH + timedelta(milliseconds=ms)).astimezone(self.zone)


def _fields(expr: object) -> list[str]:
    if not isinstance(expr, str):
        raise CronError(f"a cron expression must be a string, not {type(expr).__name__}")
    if len(expr) > MAX_LENGTH:
        raise CronError(f"a cron expression has at most {MAX_LENGTH} characters, not {len(expr)}")
    if not expr.isascii():  # else str.split and croniter would not agree on the fields
        raise CronError(f"cron expression {expr!r}: only ASCII characters")
    text = ALIASES.get(expr.strip().lower(), expr)
    if text.lstrip().startswith("@"):
        raise CronError(f"cron expression {expr!r}: the @ forms are {', '.join(ALIASES)}")
    fields = text.split()
    if len(fields) not in (5, 6):
        raise CronError(f"cron expression {expr!r} has {len(fields)} fields: it needs 5 "
                        "(minute hour day month weekday) or 6 (with a second first)")
    drawn = [f for f in fields if _DRAWN.fullmatch(f)]
    if drawn:
        raise CronError(f"cron expression {expr!r}: {drawn[0]!r} is drawn at random or hashed, "
                        "but every worker must compute the same occurrences")
    try:
        # strict: a day the months named never have (Feb 30) is refused here, not found by
        # croniter searching fifty years for it at every occurrence.
        croniter.expand(" ".join(fields), second_at_beginning=len(fields) == 6, strict=True)
    except (ValueError, TypeError) as exc:  # croniter's errors are ValueErrors but one
        raise CronError(f"cron expression {expr!r}: {exc}") from exc
    return fields


def _zone(name: object) -> ZoneInfo:
    if not isinstance(name, str):
        raise CronError(f"a timezone must be a string, not {type(name).__name__}")
    if name == "localtime":
        raise CronError("timezone 'localtime' is the host's own: name the zone (e.g. 'Europe/Lisbon'), so "
                        "every worker reads the schedule alike")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise CronError(f"timezone {name!r} is not an IANA timezone name (such as 'Europe/Lisbon' or 'UTC')") from exc


@dataclass(frozen=True)
class Firing:
    """What a due schedule does: queue one job per occurrence of ``fire`` (oldest first),
    report ``skipped`` occurrences it missed, and wait for ``next``."""

    fire: list[int]
    skipped: int
    next: int


def due(cron: Cron, next_ms: int, now_ms: int, grace_ms: int, *, limit: int = 1000) -> Firing:
    """What a schedule waiting for the occurrence ``next_ms`` does at ``now_ms``.

    Nothing before ``next_ms``. Then each occurrence from ``next_ms`` to ``now_ms`` fires if it
    is at most ``grace_ms`` late, oldest first and at most ``limit`` of them; the rest are
    skipped, and the schedule waits for the first occurrence after ``now_ms``.

    A schedule stopped for a long time costs bounded time: skipped occurrences are counted one
    by one up to ``MAX_COUNTED`` only, so past that ``skipped`` says fewer than were missed.
    """
    if next_ms > now_ms:
        return Firing([], 0, next_ms)
    oldest = now_ms - grace_ms
    fire: list[int] = []
    skipped = 0
    at, later = next_ms, cron.occurrences_after(next_ms)
    while at <= now_ms:
        if at >= oldest and len(fire) < limit:
            fire.append(at)
        elif skipped < MAX_COUNTED:
            skipped += 1
        else:
            # Counting on would take time in proportion to the outage: stop counting, and go
            # straight to the first occurrence in the grace (or past now, beyond the limit).
            at = cron.next_after(oldest - 1 if at < oldest else now_ms)
            later = cron.occurrences_after(at)
            continue
        at = next(later)
    return Firing(fire, skipped, at)
