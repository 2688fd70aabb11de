"""The audit trail: one entry per finished execution, whichever door it came in by, in the
stream ``keys.AUDIT``.

An entry is written by the script that writes the execution's record (SETTLE, and ``impose``
for cancels, reaps and expiries), in the same step: no execution finishes without its entry, and
none has two (the record is written once). A finished execution answered again to a retry of its
request id gets an entry of its own, marked ``replayed`` (REPLAYED). The entry is made of what
the execution's hash says (its request id, job, principal, effect, door, worker and times: SUBMIT
and PROMOTE write them) and of its record's metrics label (tool, status, error code): never its
arguments, output or any secret.

The scripts write without trimming; every janitor trims the stream about once a second to
``CARMY_AUDIT_MAX_ENTRIES`` entries and ``CARMY_AUDIT_RETENTION`` seconds (TRIM), approximately
(``~``), so that a trim costs Redis next to nothing. Entry ids are Redis's clock (ms), so a time
range is an id range.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from msgspec import Struct
from redis.asyncio import Redis

from carmy_worker.store import keys, metrics
from carmy_worker.store.jobstore import rfc3339
from carmy_worker.store.lua import ACCEPTED_WORK, LUA_AUDIT, NOW
from carmy_worker.store.scripts import Script, bind
from carmy_worker.wire import AuditEntry, Record

# A finished execution answered again to a retry (its request id seen before).
# KEYS: audit stream, exe; ARGV: exec_id, metrics label of its record, run ms or '', the retry's door
REPLAYED = Script("AUDIT_REPLAYED", ACCEPTED_WORK + NOW + LUA_AUDIT + """
audit(KEYS[1], KEYS[2], ARGV[1], now, ARGV[2], ARGV[3], ARGV[4])
return 1
""")

# Keeps the trail within its bounds, approximately: at most ARGV[1] entries, none older than
# ARGV[2] ms by Redis's clock.
# KEYS: audit stream; ARGV: max entries, retention ms
TRIM = Script("AUDIT_TRIM", ACCEPTED_WORK + NOW + """
local trimmed = redis.call('XTRIM', KEYS[1], 'MAXLEN', '~', tonumber(ARGV[1]))
return trimmed + redis.call('XTRIM', KEYS[1], 'MINID', '~', tostring(now - tonumber(ARGV[2])))
""")

# Entries one read looks at, at most, for entries that match its filters: a page of a rare
# tool or principal may come back short, with the cursor to go on from.
SCAN_AT_MOST = 10_000
CHUNK = 500


class AuditFilter(Struct, frozen=True, kw_only=True):
    """Which entries a read wants: each given field must match exactly; ``since_ms`` and
    ``until_ms`` bound when they were written (inclusive, Unix ms); ``execution_id``: only those
    of one execution (its own entry and its replays)."""

    tool: str | None = None
    principal: str | None = None
    status: str | None = None
    execution_id: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None

    def matches(self, entry: AuditEntry) -> bool:
        return ((self.tool is None or entry.tool == self.tool)
                and (self.principal is None or entry.principal == self.principal)
                and (self.status is None or entry.status == self.status)
                and (self.execution_id is None or entry.execution_id == self.execution_id))


EVERY_ENTRY = AuditFilter()
LAST_SEQ = 2**64 - 1  # the highest sequence number of an entry id: every entry of that ms


class AuditPage(Struct):
    """Entries, newest first, and the cursor of the next (older) page: None at the end."""

    entries: list[AuditEntry]
    cursor: str | None


def is_cursor(value: str) -> bool:
    """Whether ``value`` is an entry id (``<ms>-<seq>``), as a page's cursor is."""
    ms, dash, seq = value.partition("-")
    return bool(dash) and ms.isdigit() and seq.isdigit() and len(ms) <= 15 and len(seq) <= 15


class AuditTrail:
    """Reads of the audit trail, replay entries, and its trim, on one client."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._replayed = bind(redis, REPLAYED)
        self._trim = bind(redis, TRIM)

    async def replayed(self, exec_id: str, record: Record, *, via: str) -> None:
        """The entry of ``exec_id``'s ``record`` answered again to a retry that came by ``via``."""
        await self._replayed(keys=[keys.AUDIT, keys.execution(exec_id)],
                             args=[exec_id, metrics.label(record),
                                   "" if record.duration_ms is None else record.duration_ms, via])

    async def trim(self, *, max_entries: int, retention_s: int) -> int:
        """TRIM: the entries it took off (whole stream nodes only: ``~``)."""
        return int(await self._trim(keys=[keys.AUDIT], args=[max_entries, retention_s * 1000]))

    async def page(self, wanted: AuditFilter = EVERY_ENTRY, *, limit: int = 50, cursor: str | None = None,
                   scan_at_most: int = SCAN_AT_MOST) -> AuditPage:
        """Up to ``limit`` entries that match ``wanted``, newest first, older than ``cursor``
        (an id a page returned). At most ``scan_at_most`` entries are looked at: the page then
        ends early, with a cursor to go on from."""
        high = f"({cursor}" if cursor else "+" if wanted.until_ms is None else f"{wanted.until_ms}-{LAST_SEQ}"
        low = "-" if wanted.since_ms is None else f"{wanted.since_ms}-0"
        found: list[AuditEntry] = []
        scanned = 0
        while scanned < scan_at_most:
            count = min(CHUNK, scan_at_most - scanned) if len(found) < limit else 0
            if count == 0:
                break
            raw = await self.redis.xrevrange(keys.AUDIT, max=high, min=low, count=count)
            scanned += len(raw)
            for entry_id, fields in raw:
                entry = decode(entry_id, fields)
                high = f"({entry.id}"
                if wanted.matches(entry):
                    found.append(entry)
                    if len(found) == limit:
                        return AuditPage(found, entry.id)
            if len(raw) < count:
                return AuditPage(found, None)
        return AuditPage(found, high[1:] if high.startswith("(") else None)

    async def length(self) -> int:
        """How many entries the trail holds."""
        return int(await self.redis.xlen(keys.AUDIT))


def decode(entry_id: bytes | str, fields: dict[Any, Any]) -> AuditEntry:
    """An entry as the stream holds it (ms times, '' for nothing) as the wire shows it."""
    f = {_text(k): _text(v) for k, v in fields.items()}
    queued_at, started_at, finished_at = (_ms(f.get(name, "")) for name in ("queued_at", "started_at", "finished_at"))
    finished = finished_at if finished_at is not None else 0
    began = started_at if started_at is not None else finished
    duration = _ms(f.get("duration_ms", ""))
    if duration is None and started_at is not None:
        duration = max(0, finished - started_at)
    replayed = f.get("replayed") == "1"
    return AuditEntry(
        id=_text(entry_id), execution_id=f.get("execution_id", ""), request_id=f.get("request_id") or None,
        job_id=f.get("job_id") or None, principal=f.get("principal") or None, tool=f.get("tool", ""),
        effect=f.get("effect") or None, status=f.get("status", ""), error_code=f.get("error_code") or None,
        duration_ms=duration,
        queued_ms=None if queued_at is None or replayed else max(0, began - queued_at),
        started_at=None if started_at is None else rfc3339(started_at), finished_at=rfc3339(finished),
        replayed=replayed, via=f.get("via") or None, worker=f.get("worker") or None,
    )


def decode_all(raw: Iterable[tuple[Any, dict[Any, Any]]]) -> list[AuditEntry]:
    """Entries as XRANGE, XREVRANGE or XREADGROUP return them."""
    return [decode(entry_id, fields) for entry_id, fields in raw]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _ms(value: str) -> int | None:
    return int(value) if value.isdigit() else None
