"""``python -m carmy_worker MODULE``: what stops a worker before it serves."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import ROOT


def test_a_bad_schedule_stops_the_worker_at_start() -> None:
    """Two Toolboxes of the module declare ``tick``: exit 2 naming it, before any Redis (the
    one configured does not exist)."""
    env = os.environ | {"CARMY_REDIS_URL": "redis://127.0.0.1:1/0"}
    result = subprocess.run([sys.executable, "-m", "carmy_worker", "tests.carmy_worker.sdk.two_schedules"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=20)
    assert result.returncode == 2, result.stderr
    assert "carmy_worker: schedule 'tick': declared in two Toolboxes of" in result.stderr
