"""Partition counts for a test (every key this process names is named over them).

``partitions(n)`` names every key over ``n`` partitions for the ``with`` block and restores the
count before after it; ``four_partitions`` is the fixture that does it for a whole test over
four. ``cells`` runs a test twice: under the partition count the session runs with (one, or
``CARMY_REDIS_PARTITIONS``, or the slot recorder's), and under four partitions if the session
runs one (and records no slots: ``tests/slotrecorder.py``), so that the store's jobs are checked
spread over several cells whatever its count.

Use a fixture with ``pytest.mark.usefixtures`` after importing it. They name keys only
(``keys.use_partitions``): a test that starts processes passes them its count."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from carmy_worker.store import keys


@contextlib.contextmanager
def partitions(count: int) -> Iterator[int]:
    """Every key of this process named over ``count`` partitions meanwhile."""
    before = keys.partition_count()
    keys.use_partitions(count)
    try:
        yield count
    finally:
        keys.use_partitions(before)


@pytest.fixture
def one_partition() -> Iterator[int]:
    """Every key named over one partition for the test, whatever the session's count: for a test
    of what one partition's client does, which over several would go otherwise by design."""
    with partitions(1) as count:
        yield count


@pytest.fixture
def four_partitions() -> Iterator[int]:
    """Every key named over four partitions for the test, whatever the session's count."""
    with partitions(4) as count:
        yield count


@pytest.fixture(params=["as-configured", "four-partitions"])
def cells(request: pytest.FixtureRequest) -> Iterator[int]:
    """The partition count the test runs with."""
    count = keys.partition_count()
    if request.param == "four-partitions":
        if count > 1:  # the session spreads its keys already (and may draw ids for its own count)
            pytest.skip(f"the session runs {count} partitions")
        if os.environ.get("CARMY_SLOT_REPORT"):  # tests/slotrecorder.py records the session's count's calls
            pytest.skip("the slot recorder records the calls of the session's own count")
        count = 4
    with partitions(count):
        yield count
