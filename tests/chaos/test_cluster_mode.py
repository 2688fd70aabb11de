"""``bin/chaos --cluster``, briefly: real APIs and workers on a local Redis Cluster while its
primaries are killed and a partition's slot moves between them. The table is produced with every
promise kept; and the same run with migrations broken on purpose (``broken_migration``: the
slot's keys dropped) fails with the requests whose records went with them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench.processes import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(420)]

# Short and small, the two cluster faults only; no jobs nor webhooks (a job a broken migration
# lost is read until the patience runs out, which would only make the run longer).
ARGS = ["--cluster", "--duration", "16", "--seed", "4", "--faults", "cluster-failover,slot-migrate",
        "--jobs", "0", "--hooks", "0", "--clients", "8", "--workers", "2", "--apis", "1"]


def chaos(module: str, out: Path) -> tuple[int, dict[str, Any], str]:
    """Runs ``module`` with ``ARGS``; its exit code, its JSON table and its printed output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARMY_")}
    done = subprocess.run([sys.executable, "-m", module, *ARGS, "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=400, check=False)
    text = done.stdout + done.stderr[-4000:]
    assert out.exists(), text
    return done.returncode, json.loads(out.read_bytes()), text


def injected(doc: dict[str, Any]) -> Counter[str]:
    return Counter(fault["kind"] for fault in doc["run"]["injected"])


def test_a_failover_and_a_slot_migration_under_load_break_no_promise(tmp_path: Path) -> None:
    code, doc, text = chaos("chaos", tmp_path / "table.json")
    assert injected(doc)["cluster-failover"] >= 1 and injected(doc)["slot-migrate"] >= 1, text
    assert doc["run"]["cluster"] and doc["table"]["requests"] > 100, text
    assert doc["violations"] == {} and code == 0, text
    assert "PASS" in text


def test_a_migration_that_drops_the_slots_keys_is_caught(tmp_path: Path) -> None:
    code, doc, text = chaos("tests.chaos.broken_migration", tmp_path / "table.json")
    assert injected(doc)["slot-migrate"] >= 1, text
    assert code == 1 and "FAIL" in text, text
    # Every request answered before a migration lost its record and idempotency key: its retry
    # at the end runs it again as a new execution.
    assert doc["violations"].get("lost", 0) > 0, text
