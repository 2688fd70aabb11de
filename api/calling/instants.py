"""Instants written as RFC 3339 date-times, as a job's ``run_at`` and the audit trail's ``since``
and ``until`` take them: read strictly, to unix milliseconds."""

from __future__ import annotations

import datetime
import re

# RFC 3339's date-time (section 5.6), and nothing else of ISO 8601 that Python's fromisoformat
# also reads (20261224T1800Z, 2026-W52-4T18Z, a time without seconds, +0100): "T" and "Z" in
# either case, as its section 5.6 allows, a fraction of any length, an offset to 23:59.
_FORM = re.compile(r"(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d+))?(?:[Zz]|([+-])(\d\d):(\d\d))",
                   re.ASCII)
_EPOCH = datetime.datetime(1970, 1, 1)
FIRST_MS = (datetime.datetime(1, 1, 1) - _EPOCH) // datetime.timedelta(milliseconds=1)
LAST_MS = (datetime.datetime(9999, 12, 31, 23, 59, 59, 999_000) - _EPOCH) // datetime.timedelta(milliseconds=1)


def read_rfc3339(text: str) -> int | None:
    """``text`` as unix ms, None unless it is an RFC 3339 date-time. A fraction finer than a
    millisecond rounds up (never due before the time asked); a leap second (``23:59:60Z``,
    which unix time does not count) is the second after it."""
    found = _FORM.fullmatch(text)
    if found is None:
        return None
    year, month, day, hour, minute, second, fraction, sign, off_h, off_m = found.groups()
    if off_h is not None and (int(off_h) > 23 or int(off_m) > 59):
        return None
    leap = second == "60"
    try:  # a naive UTC-less wall time: the offset is applied below, so year 1 and 9999 still parse
        wall = datetime.datetime(int(year), int(month), int(day), int(hour), int(minute), 59 if leap else int(second))
    except ValueError:  # no such day or time (2026-02-30, 24:00:00)
        return None
    offset = 0 if sign is None else (1 if sign == "+" else -1) * (int(off_h) * 60 + int(off_m))
    ms = (wall - _EPOCH) // datetime.timedelta(milliseconds=1) - offset * 60_000 + (1000 if leap else 0)
    if fraction:  # read three digits at most: int() refuses a string of thousands
        ms += int(fraction[:3].ljust(3, "0")) + (1 if fraction[3:].strip("0") else 0)
    return ms
