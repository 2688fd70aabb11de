"""Redis Cluster runs a script only when the keys it declares share one hash slot (CROSSSLOT
otherwise). The store's script tests are run again in a process whose keys are spread over 16
partitions (``tests/slotrecorder.py``), recording the slots of the keys each call declared: a
script that spans two slots there would be refused by a cluster running 16 partitions.

Every script runs inside one partition (docs/architecture.md, section 3), so ``SPANNING`` is
empty: a script that starts spanning slots fails here. It stays a named set, rather than an
assertion of none, so that a failure says which scripts span.
"""

from __future__ import annotations

import pytest

from carmy_worker.store.scripts import SCRIPTS
from tests.recordings import RECORDING_TIMEOUT_S, Recordings

# The store's tests run again in processes of their own (tests.recordings), within the first
# test's setup.
pytestmark = pytest.mark.timeout(RECORDING_TIMEOUT_S + 60)

# Scripts whose declared keys span slots over 16 partitions: none, now that every key but the
# few outside the cells (architecture.md, section 3) is in a partition, and every script runs in
# one (the execution's, the job's, the schedule's, or each of those a caller loops over).
SPANNING: set[str] = set()


@pytest.fixture(scope="module")
def seen(script_recordings: Recordings) -> dict[str, list[list[int]]]:
    return script_recordings[16].slots


@pytest.mark.slow
def test_only_the_scripts_known_to_span_slots_do(seen: dict[str, list[list[int]]]) -> None:
    spanning = {name for name, calls in seen.items() if any(len(slots) > 1 for slots in calls)}
    assert spanning == SPANNING


@pytest.mark.slow
def test_most_scripts_are_driven_by_the_store_tests(seen: dict[str, list[list[int]]]) -> None:
    # Driven by the API's tests instead (or by none of the store's): not checked here yet.
    elsewhere = {"MARK", "PULSE", "PURGE_JOB", "REMEMBER", "RENEW", "RETRY_JOB", "STATES"}
    store_scripts = {name for name in SCRIPTS if not name.startswith("TEST_")}
    assert store_scripts - set(seen) <= elsewhere
