"""A fixture that runs a test twice: under the partition count the session runs with (one, or
``CARMY_REDIS_PARTITIONS``, or the slot recorder's), and under four partitions if the session
runs one (and records no slots: ``tests/slotrecorder.py``), so that the store's jobs are checked
spread over several cells whatever its count.

Use it with ``pytestmark = pytest.mark.usefixtures("cells")`` after importing it; it names
keys only (``keys.use_partitions``): a test that starts processes passes them its count."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from carmy_worker.store import keys


@pytest.fixture(params=["as-configured", "four-partitions"])
def cells(request: pytest.FixtureRequest) -> Iterator[int]:
    """The partition count the test runs with."""
    before = keys.partition_count()
    if request.param == "four-partitions":
        if before > 1:  # the session spreads its keys already (and may draw ids for its own count)
            pytest.skip(f"the session runs {before} partitions")
        if os.environ.get("CARMY_SLOT_REPORT"):  # tests/slotrecorder.py records the session's count's calls
            pytest.skip("the slot recorder records the calls of the session's own count")
        keys.use_partitions(4)
    try:
        yield keys.partition_count()
    finally:
        keys.use_partitions(before)
