"""The audit trail over partitions (store.audit, store.shipment), against the real Redis, with
one partition and with four: entries written by the real script (REPLAYED) into their
executions' partitions' streams; pages of the merged trail go newest first without a duplicate
or a gap whatever the page size, the filter or the bound on entries looked at; ids are unique in
the trail even where two partitions' streams hold the same id; the trim keeps each partition to
its share; the sink's group ships each entry once and acknowledges it in its own partition."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio

from carmy_worker.store import keys, records
from carmy_worker.store.audit import AuditFilter, AuditTrail, stream_id, trail_id
from carmy_worker.store.shipment import GROUP, Shipment
from tests import cells
from tests.support import RedisServer

ENTRIES = 240


@pytest.fixture(params=[1, 4], ids=["one-partition", "four-partitions"])
def partitions(request: pytest.FixtureRequest) -> Iterator[int]:
    with cells.partitions(request.param) as count:
        yield count


@pytest.fixture
async def client(redis_server: RedisServer, partitions: int) -> AsyncIterator[redis.asyncio.Redis]:
    c = redis.asyncio.Redis.from_url(redis_server.url)
    await c.flushall()
    yield c
    await c.aclose()


async def write(trail: AuditTrail, count: int) -> list[str]:
    """``count`` entries, each of an execution of its own spread over every partition, written by
    REPLAYED as an API writes one (oldest first); their execution ids."""
    written = []
    for i in range(count):
        exec_id = keys.new_execution_id(i % keys.partition_count())
        tool = "rare" if i % 7 == 0 else "echo"
        record = records.completed(exec_id, tool, b"{}", cacheable=False, duration_ms=3)
        await trail.replayed(exec_id, record, via="http")
        written.append(exec_id)
    return written


async def every_page(trail: AuditTrail, wanted: AuditFilter, *, limit: int, scan_at_most: int) -> list[list[str]]:
    """The ids of each page's entries, cursor after cursor, to the end."""
    pages, cursor = [], None
    while True:
        page = await trail.page(wanted, limit=limit, cursor=cursor, scan_at_most=scan_at_most)
        pages.append([entry.execution_id for entry in page.entries])
        assert len(pages) <= ENTRIES + 1, "the cursor never reaches the end"
        if page.cursor is None:
            return pages
        cursor = page.cursor


async def test_pages_merge_the_partitions_newest_first_without_duplicates_or_gaps(
        client: redis.asyncio.Redis) -> None:
    trail = AuditTrail(client)
    written = await write(trail, ENTRIES)
    assert {n for n in keys.partitions() if await client.xlen(keys.audit(n))} == set(keys.partitions())
    everything = (await trail.page(limit=ENTRIES + 1)).entries
    assert sorted(e.execution_id for e in everything) == sorted(written)
    assert len({e.id for e in everything}) == ENTRIES  # unique in the trail, one stream's ids or four
    order = [tuple(int(part) for part in e.id.split("-")) for e in everything]
    assert order == sorted(order, reverse=True)
    # Newest first to the ms (one Redis, one clock): an entry written after another never has an
    # older ms, whichever partition either is in.
    ms_of = {e.execution_id: order[i][0] for i, e in enumerate(everything)}
    assert [ms_of[xid] for xid in written] == sorted(ms_of[xid] for xid in written)
    for limit in (1, 7, 50):
        pages = await every_page(trail, AuditFilter(), limit=limit, scan_at_most=10_000)
        assert [xid for page in pages for xid in page] == [e.execution_id for e in everything]
    # A rare tool, with pages cut short by the bound on entries looked at: still each once, in order.
    rare = [e.execution_id for e in everything if e.tool == "rare"]
    pages = await every_page(trail, AuditFilter(tool="rare"), limit=3, scan_at_most=11)
    assert [xid for page in pages for xid in page] == rare
    assert any(len(page) < 3 for page in pages[:-1])  # some ended on the bound, with a cursor


async def test_an_ids_partition_and_stream_id_come_back_from_it(partitions: int) -> None:
    for partition in keys.partitions():
        for in_stream in ("1700000000000-0", "1700000000000-5"):
            assert stream_id(trail_id(in_stream, partition)) == (partition, in_stream)
    assert trail_id("1700000000000-3", 0) == ("1700000000000-3" if partitions == 1 else "1700000000000-12")


async def test_equal_stream_ids_in_two_partitions_are_two_entries_in_the_trail(client: redis.asyncio.Redis) -> None:
    for partition in keys.partitions():
        for seq in range(3):
            await client.xadd(keys.audit(partition), {"execution_id": f"p{partition}-{seq}", "finished_at": 5},
                              id=f"5-{seq}")
    trail = AuditTrail(client)
    pages = await every_page(trail, AuditFilter(), limit=2, scan_at_most=10_000)
    found = [xid for page in pages for xid in page]
    assert sorted(found) == sorted(f"p{p}-{s}" for p in keys.partitions() for s in range(3))
    # An execution's entries are read from its partition's stream only.
    exec_id = keys.new_execution_id(keys.partition_count() - 1)
    record = records.completed(exec_id, "echo", b"{}", cacheable=False, duration_ms=3)
    await trail.replayed(exec_id, record, via="mcp")
    [own] = (await trail.page(AuditFilter(execution_id=exec_id), scan_at_most=1)).entries
    assert own.execution_id == exec_id and own.via == "mcp"


async def test_the_trim_keeps_each_partition_to_its_share(client: redis.asyncio.Redis) -> None:
    trail = AuditTrail(client)
    for partition in keys.partitions():
        pipe = client.pipeline(transaction=False)
        for i in range(1000):
            pipe.xadd(keys.audit(partition), {"execution_id": f"{partition}-{i}"})
        await pipe.execute()
    await trail.trim(max_entries=400, retention_s=3600)
    share = keys.share(400)
    for partition in keys.partitions():
        # `~` drops whole stream nodes (100 entries each by default): a little more is kept.
        assert share <= await client.xlen(keys.audit(partition)) < share + 100
    assert await trail.length() == sum([await client.xlen(keys.audit(n)) for n in keys.partitions()])


async def test_the_sinks_group_ships_each_entry_of_every_partition_once(client: redis.asyncio.Redis) -> None:
    one, two = Shipment(client, "one"), Shipment(client, "two")
    await one.join()
    await two.join()
    written = await write(AuditTrail(client), 60)
    shipped: list[str] = []
    for turn in range(60):
        lot = await (one if turn % 2 else two).read(5, block_ms=10)
        if not lot.ids:
            break
        shipped += [entry.execution_id for entry in lot.entries]
        await (one if turn % 2 else two).ack(lot.ids)
    assert sorted(shipped) == sorted(written)
    for partition in keys.partitions():
        assert (await client.xpending(keys.audit(partition), GROUP))["pending"] == 0
    assert (await one.pending(100)).ids == [] and (await two.pending(100)).ids == []
