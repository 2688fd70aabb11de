"""Redis Cluster runs a script only when the keys it declares share one hash slot (CROSSSLOT
otherwise). The store's script tests are run again in a process whose keys are spread over 16
partitions (``tests/slotrecorder.py``), recording the slots of the keys each call declared: a
script that spans two slots there would be refused by a cluster running 16 partitions.

Every script runs inside one partition (docs/architecture.md, section 3), so ``SPANNING`` is
empty: a script that starts spanning slots fails here. It stays a named set, rather than an
assertion of none, so that a failure says which scripts span.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from carmy_worker.store.scripts import SCRIPTS

ROOT = Path(__file__).parents[3]
# The store's tests run again in a process of their own (up to 300 s on a busy machine), within
# the first test's setup.
pytestmark = pytest.mark.timeout(360)
DRIVEN = ["tests/carmy_worker/store", "tests/carmy_worker/jobs", "tests/carmy_worker/runtime"]

# Scripts whose declared keys span slots over 16 partitions: none, now that every key but the
# few outside the cells (architecture.md, section 3) is in a partition, and every script runs in
# one (the execution's, the job's, the schedule's, or each of those a caller loops over).
SPANNING: set[str] = set()


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[list[int]]]:
    report = tmp_path_factory.mktemp("slots") / "slots.json"
    env = {**os.environ, "CARMY_SLOT_REPORT": str(report), "CARMY_SLOT_PARTITIONS": "16"}
    env.pop("CARMY_REDIS_PARTITIONS", None)  # the recorder's 16 partitions, whatever this run's
    # Their own failures do not matter here (keys named inside Lua from partition 0's prefixes
    # miss an execution of another partition): only the keys each call declared are looked at.
    subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.slotrecorder", "-q", "-p", "no:cacheprovider",
                    "-m", "not e2e and not slow", *DRIVEN], cwd=ROOT, env=env, capture_output=True, timeout=300,
                   check=False)
    recorded: dict[str, list[list[int]]] = json.loads(report.read_text())
    return recorded


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
