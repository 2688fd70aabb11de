"""The end of a run's one read of the audit trail: every final record and every entry of the
stream, as Redis holds them, for ``chaos.auditcheck`` to set against each other.

The schedule goes on firing while this reads, so executions still finish meanwhile. The order
makes that harmless: the newest entry id first, then the records, then the whole stream. A
script writes a record and its entry together, so every record read has its entry in the stream
read after it, and every entry up to the id noted first had its record before the records were
read (``chaos.model.Trail.before``); a later entry's record may or may not have been seen.

The client is a single server's or a Redis Cluster's (``--cluster``): the records are read one
partition at a time, each partition's in its own slot, so that every ``MGET`` stays in one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis
import redis.cluster

from carmy_worker.store import keys
from carmy_worker.wire import record_decoder
from chaos.model import RawEntry, RecordSeen, Trail

PAGE = 1000  # records per SCAN and MGET, entries per XRANGE
Client = redis.Redis | redis.cluster.RedisCluster


def read_trail(client: Client) -> Trail:
    """Every record and every entry of the trail, read in the order the module's doc explains."""
    newest: Any = client.xrevrange(keys.AUDIT, count=1)  # redis-py's sync client is typed as either
    before = _text(newest[0][0]) if newest else None
    records = list(_records(client))
    entries = list(_entries(client))
    return Trail(records=records, entries=entries, before=before, added=_added(client, len(entries)))


def _records(client: Client) -> Iterator[RecordSeen]:
    for partition in keys.partitions():
        yield from _records_of(client, partition)


def _records_of(client: Client, partition: int) -> Iterator[RecordSeen]:
    names = list(client.scan_iter(match=keys.record_prefix(partition) + "*", count=PAGE))
    for i in range(0, len(names), PAGE):
        chunk = names[i:i + PAGE]
        values: Any = client.mget(chunk)
        for name, raw in zip(chunk, values, strict=True):
            if raw is None:  # gone between the scan and the read: records are kept a day, so never
                continue
            record = record_decoder.decode(raw)
            yield RecordSeen(xid=_text(name).rpartition(":")[2], tool=record.tool,
                             status=record.status, error_code=record.error_code)


def _entries(client: Client) -> Iterator[RawEntry]:
    low = "-"
    while True:
        page: Any = client.xrange(keys.AUDIT, min=low, count=PAGE)
        for entry_id, fields in page:
            yield RawEntry(id=_text(entry_id), fields={_text(k): _text(v) for k, v in fields.items()})
        if len(page) < PAGE:
            return
        low = "(" + _text(page[-1][0])


def _added(client: Client, held: int) -> int:
    """Entries ever added to the stream (Redis 7's ``entries-added``), or ``held`` without one."""
    try:
        info: Any = client.xinfo_stream(keys.AUDIT)
    except redis.ResponseError:  # no stream: nothing was ever added
        return held
    added = info.get("entries-added", info.get(b"entries-added"))
    return held if added is None else int(added)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
