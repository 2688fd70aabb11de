"""The audit trail: one entry per finished execution, whichever door it came in by, in the
stream of its partition (``keys.audit``); the trail is every partition's stream, merged.

An entry is written by the script that writes the execution's record (SETTLE, and ``impose``
for cancels, reaps and expiries), in the same step: no execution finishes without its entry, and
none has two (the record is written once). A finished execution answered again to a retry of its
request id gets an entry of its own, marked ``replayed`` (REPLAYED), in the same partition's
stream. The entry is made of what the execution's hash says (its request id, job, principal,
effect, door, worker and times: SUBMIT and PROMOTE write them) and of its record's metrics label
(tool, status, error code): never its arguments, output or any secret.

The scripts write without trimming; every janitor trims each partition's stream about once a
second to its share of ``CARMY_AUDIT_MAX_ENTRIES`` entries and to ``CARMY_AUDIT_RETENTION``
seconds (TRIM), approximately (``~``), so that a trim costs Redis next to nothing. Entry ids are
Redis's clock (ms), so a time range is an id range.

**Ids over partitions.** Each partition's stream numbers its entries on its own, so two
partitions may hold the same stream id (two entries in one ms). An entry's id in the trail
(``trail_id``, what pages, cursors and the sink show) spreads the sequence number over the
partitions, ``<ms>-<seq * N + partition>``: unique in the trail, in each stream's order, and the
stream id itself with one partition. Reads merge the partitions' XREVRANGEs newest first by it
(a k-way merge) and a cursor is the last trail id a page looked at: every partition goes on
strictly below it. Across Redis Cluster primaries each stream's ms is its own primary's clock:
the merged order is good to the clocks' skew (a few ms), not a total order of when things ended.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Iterable
from typing import Any

from msgspec import Struct
from redis.asyncio import Redis

from carmy_worker.store import keys, metrics
from carmy_worker.store.fanout import run_each_reaching
from carmy_worker.store.jobstore import rfc3339
from carmy_worker.store.lua import ACCEPTED_WORK, LUA_AUDIT, NOW
from carmy_worker.store.scripts import Script, bind
from carmy_worker.wire import AuditEntry, Record, is_digits

# A finished execution answered again to a retry (its request id seen before).
# KEYS: audit stream, exe; ARGV: exec_id, metrics label of its record, run ms or '', the retry's door
REPLAYED = Script("AUDIT_REPLAYED", ACCEPTED_WORK + NOW + LUA_AUDIT + """
audit(KEYS[1], KEYS[2], ARGV[1], now, ARGV[2], ARGV[3], ARGV[4])
return 1
""")

# Keeps one partition's stream within its bounds, approximately: at most ARGV[1] entries (its
# share of the trail's), none older than ARGV[2] ms by Redis's clock.
# KEYS: audit stream; ARGV: max entries, retention ms
TRIM = Script("AUDIT_TRIM", ACCEPTED_WORK + NOW + """
local trimmed = redis.call('XTRIM', KEYS[1], 'MAXLEN', '~', tonumber(ARGV[1]))
return trimmed + redis.call('XTRIM', KEYS[1], 'MINID', '~', tostring(now - tonumber(ARGV[2])))
""")

# Entries one read looks at, at most, for entries that match its filters: a page of a rare
# tool or principal may come back short, with the cursor to go on from.
SCAN_AT_MOST = 10_000
CHUNK = 500  # entries one XREVRANGE reads, over every partition's together
MIN_CHUNK = 50  # of one partition, at least


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
    return bool(dash) and is_digits(ms) and is_digits(seq) and len(ms) <= 15 and len(seq) <= 15


def trail_id(stream_id: bytes | str, partition: int) -> str:
    """The id in the trail of the entry ``stream_id`` of ``partition``'s stream (see the module)."""
    ms, _, seq = _text(stream_id).partition("-")
    count = keys.partition_count()
    return f"{ms}-{int(seq) * count + partition}" if count > 1 else f"{ms}-{seq}"


def stream_id(entry_id: str) -> tuple[int, str]:
    """The partition of the trail id ``entry_id`` and the entry's id in that partition's stream."""
    ms, _, seq = entry_id.partition("-")
    in_stream, partition = divmod(int(seq), keys.partition_count())
    return partition, f"{ms}-{in_stream}"


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


def below(cursor: str, partition: int) -> str:
    """The XREVRANGE ``max`` of ``partition``'s entries strictly older in the trail than the
    trail id ``cursor``."""
    ms, seq = _order(cursor)
    spread = seq - partition  # its entries of that ms older than the cursor: seq * N < spread
    return f"({ms}-0" if spread <= 0 else f"{ms}-{(spread - 1) // keys.partition_count()}"


def _newest_first(entry: AuditEntry) -> tuple[int, int]:
    """The merge's key of ``entry``: the newest in the trail has the smallest (for ``heapq``)."""
    ms, seq = _order(entry.id)
    return -ms, -seq


class _Stream:
    """One partition's part of a read: entries read ahead, newest first (each with its merge
    key, ``_newest_first``), and where it goes on."""

    __slots__ = ("ahead", "high", "low", "partition", "spent")

    def __init__(self, partition: int, high: str, low: str) -> None:
        self.partition = partition
        self.high, self.low = high, low
        self.ahead: deque[tuple[tuple[int, int], AuditEntry]] = deque()
        self.spent = False  # nothing older is left in range

    async def read(self, redis: Redis, count: int) -> None:
        raw = await redis.xrevrange(keys.audit(self.partition), max=self.high, min=self.low, count=count)
        entries = (decode(entry_id, fields, self.partition) for entry_id, fields in raw)
        self.ahead.extend((_newest_first(entry), entry) for entry in entries)
        if raw:
            self.high = f"({_text(raw[-1][0])}"
        self.spent = len(raw) < count


class AuditTrail:
    """Reads of the audit trail, replay entries, and its trim, on one client."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._replayed = bind(redis, REPLAYED)

    async def replayed(self, exec_id: str, record: Record, *, via: str) -> None:
        """The entry of ``exec_id``'s ``record`` answered again to a retry that came by ``via``."""
        await self._replayed(keys=[keys.audit(keys.partition_of(exec_id)), keys.execution(exec_id)],
                             args=[exec_id, metrics.label(record),
                                   "" if record.duration_ms is None else record.duration_ms, via])

    async def trim(self, *, max_entries: int, retention_s: int) -> int:
        """TRIM of every partition's stream, each to its share of ``max_entries``, in one pipeline
        (``store.fanout``; each partition alone when a cluster's primary is down, so that the
        others are trimmed): the entries taken off (whole stream nodes only: ``~``)."""
        args = [keys.share(max_entries), retention_s * 1000]
        trimmed = await run_each_reaching(self.redis, TRIM, [([keys.audit(p)], args) for p in keys.partitions()])
        return sum(int(n) for n in trimmed if not isinstance(n, Exception))

    async def page(self, wanted: AuditFilter = EVERY_ENTRY, *, limit: int = 50, cursor: str | None = None,
                   scan_at_most: int = SCAN_AT_MOST) -> AuditPage:
        """Up to ``limit`` entries that match ``wanted``, newest first, older than ``cursor``
        (an id a page returned). At most ``scan_at_most`` entries are looked at, over every
        partition together: the page then ends early, with a cursor to go on from."""
        streams = self._streams(wanted, cursor)
        chunk = max(CHUNK // len(streams), MIN_CHUNK)
        found: list[AuditEntry] = []
        looked_at = cursor
        # The streams' next entries, by merge key: a k-way merge whose key is parsed once an entry.
        heads: list[tuple[tuple[int, int], int]] = []
        behind: Iterable[int] = range(len(streams))  # the streams whose next entry is not in heads
        for scanned in range(scan_at_most):
            reads = [streams[i].read(self.redis, min(chunk, scan_at_most - scanned)) for i in behind
                     if not streams[i].ahead and not streams[i].spent]
            if reads:
                await asyncio.gather(*reads)
            for i in behind:
                if streams[i].ahead:
                    heapq.heappush(heads, (streams[i].ahead[0][0], i))
            if not heads:
                return AuditPage(found, None)
            _, newest = heapq.heappop(heads)
            entry = streams[newest].ahead.popleft()[1]
            behind = (newest,)
            looked_at = entry.id
            if wanted.matches(entry):
                found.append(entry)
                if len(found) == limit:
                    return AuditPage(found, entry.id)
        return AuditPage(found, looked_at)

    @staticmethod
    def _streams(wanted: AuditFilter, cursor: str | None) -> list[_Stream]:
        # An execution's entries (its own and its replays) are all in its partition's stream.
        partitions = keys.partitions() if wanted.execution_id is None else [keys.partition_of(wanted.execution_id)]
        low = "-" if wanted.since_ms is None else f"{wanted.since_ms}-0"
        until = "+" if wanted.until_ms is None else f"{wanted.until_ms}-{LAST_SEQ}"
        return [_Stream(p, until if cursor is None else below(cursor, p), low) for p in partitions]

    async def length(self) -> int:
        """How many entries the trail holds."""
        async with self.redis.pipeline(transaction=False) as pipe:  # one round trip
            for partition in keys.partitions():
                pipe.xlen(keys.audit(partition))
            return sum(int(n) for n in await pipe.execute())


def decode(entry_id: bytes | str, fields: dict[Any, Any], partition: int) -> AuditEntry:
    """An entry of ``partition``'s stream as the stream holds it (ms times, '' for nothing) as
    the wire shows it, with its id in the trail (``trail_id``)."""
    f = {_text(k): _text(v) for k, v in fields.items()}
    queued_at, started_at, finished_at = (_ms(f.get(name, "")) for name in ("queued_at", "started_at", "finished_at"))
    finished = finished_at if finished_at is not None else 0
    began = started_at if started_at is not None else finished
    duration = _ms(f.get("duration_ms", ""))
    if duration is None and started_at is not None:
        duration = max(0, finished - started_at)
    replayed = f.get("replayed") == "1"
    return AuditEntry(
        id=trail_id(entry_id, partition), execution_id=f.get("execution_id", ""),
        request_id=f.get("request_id") or None,
        job_id=f.get("job_id") or None, principal=f.get("principal") or None, tool=f.get("tool", ""),
        effect=f.get("effect") or None, status=f.get("status", ""), error_code=f.get("error_code") or None,
        duration_ms=duration,
        queued_ms=None if queued_at is None or replayed else max(0, began - queued_at),
        started_at=None if started_at is None else rfc3339(started_at), finished_at=rfc3339(finished),
        replayed=replayed, via=f.get("via") or None, worker=f.get("worker") or None,
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _ms(value: str) -> int | None:
    return int(value) if value.isdigit() else None
