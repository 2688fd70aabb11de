"""The end of a run's one read of the audit trail: every final record and every entry of every
partition's stream, as Redis holds them (ids in the trail: ``store.audit.trail_id``), for
``chaos.auditcheck`` to set against each other.

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
from carmy_worker.store.audit import LAST_SEQ, trail_id
from carmy_worker.wire import record_decoder
from chaos.model import RawEntry, RecordSeen, Trail

PAGE = 1000  # records per SCAN and MGET, entries per XRANGE (of each partition's stream)
Client = redis.Redis | redis.cluster.RedisCluster


def read_trail(client: Client) -> Trail:
    """Every record and every entry of the trail, read in the order the module's doc explains."""
    before = _before(client)
    records = list(_records(client))
    entries = [entry for n in keys.partitions() for entry in _entries(client, n)]
    added = sum(_added(client, n) for n in keys.partitions())
    return Trail(records=records, entries=entries, before=before, added=added)


def _before(client: Client) -> str | None:
    """The newest entry id, with one partition. With several, each stream numbers its own within
    a ms, so the id just below the newest ms of any: an entry written after this read has a ms
    at least that (one Redis, one clock; on a cluster, the nodes of one machine's, as the chaos
    run's), and one of that very ms is checked as a later one."""
    newest: list[Any] = [client.xrevrange(keys.audit(n), count=1) for n in keys.partitions()]
    ids = [_text(found[0][0]) for found in newest if found]
    if not ids or keys.partition_count() == 1:
        return ids[0] if ids else None
    return f"{max(int(i.partition('-')[0]) for i in ids) - 1}-{LAST_SEQ}"


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


def _entries(client: Client, partition: int) -> Iterator[RawEntry]:
    low = "-"
    while True:
        page: Any = client.xrange(keys.audit(partition), min=low, count=PAGE)
        for entry_id, fields in page:
            yield RawEntry(id=trail_id(entry_id, partition), fields={_text(k): _text(v) for k, v in fields.items()})
        if len(page) < PAGE:
            return
        low = "(" + _text(page[-1][0])


def _added(client: Client, partition: int) -> int:
    """Entries ever added to the partition's stream (Redis 7's ``entries-added``)."""
    try:
        info: Any = client.xinfo_stream(keys.audit(partition))
    except redis.ResponseError:  # no stream: nothing was ever added
        return 0
    added = info.get("entries-added", info.get(b"entries-added"))
    return int(info.get("length", info.get(b"length", 0))) if added is None else int(added)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
