"""The chaos tools' releases (``deploy``): each release's workers are a worker group of their own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench.processes import ROOT

GROUP = ("from carmy_worker.runtime.presence import describe, group_of; from carmy_worker.settings import "
         "WorkerSettings; from chaos.tools import tools; print(group_of(describe(list(tools), WorkerSettings())))")


def group(release: str | None) -> str:
    """The group of a worker of ``chaos.tools`` started with ``release`` (None: the run's first)."""
    env = {k: v for k, v in os.environ.items() if k != "CHAOS_RELEASE"} | {"PYTHONPATH": str(ROOT)}
    if release is not None:
        env["CHAOS_RELEASE"] = release
    done = subprocess.run([sys.executable, "-c", GROUP], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.mark.slow
def test_each_release_is_a_group_of_its_own_and_a_release_again_is_its_group_again() -> None:
    first, second, third = group(None), group("1"), group("2")
    assert len({first, second, third}) == 3
    assert group("1") == second
