"""The store's script tests run again under ``tests/slotrecorder.py``, once per partition count
a session asks for, and shared by the tests that read them: ``tests/carmy_worker/store/test_slots.py``
(the slots each call declared, over 16 partitions) and ``tests/cluster/test_scripts_on_cluster.py``
(the calls themselves, over one partition and 16, run again on a cluster).

Each recording reruns three test folders in a process of its own (a minute and a half on 2
cores). They are made together, at the first test that asks for one, and that test waits for
all of them: the processes then share the machine with each other only, not with the tests that
come after, and no count is recorded twice in a session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from bench.processes import ROOT

# The folders whose tests drive the store's scripts: all of their tests but the e2e ones, the
# slow included, and but the one that asks for the recordings (they would make their own).
DRIVEN = ["tests/carmy_worker/store", "tests/carmy_worker/jobs", "tests/carmy_worker/runtime"]
SELF = "tests/carmy_worker/store/test_slots.py"
# The partition counts recorded: one (every key in one slot) and sixteen (a slot per partition).
COUNTS = (1, 16)
# How long the recordings may take together (up to four minutes on a busy 2-core machine): the
# tests that ask first allow for it in their own timeouts.
RECORDING_TIMEOUT_S = 420

Calls = dict[str, list[tuple[list[Any], list[Any]]]]


@dataclass(frozen=True)
class Recording:
    """What the script tests did over one partition count."""

    slots: dict[str, list[list[int]]]  # by script: each spread of hash slots its calls declared
    calls: Calls  # by script: a few of its calls (keys, arguments), as its typed wrapper built them


class Recordings:
    """Every count's recording, made once, all at once, on the first ask."""

    def __init__(self, tmp: Path) -> None:
        self._tmp = tmp
        self._made: dict[int, Recording] = {}

    def __getitem__(self, partitions: int) -> Recording:
        if os.environ.get("CARMY_SLOT_REPORT"):  # inside a recording: never one within another
            raise RuntimeError("a recording's tests asked for the recordings")
        if not self._made:
            self._made = self._record()
        return self._made[partitions]

    def _record(self) -> dict[int, Recording]:
        # Their own failures do not matter (keys named inside Lua from partition 0's prefixes
        # miss an execution of another partition): only the calls are looked at.
        running = {count: subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "tests.slotrecorder", "-q", "-p", "no:cacheprovider",
             "-m", "not e2e", f"--ignore={SELF}", *DRIVEN],
            cwd=ROOT, env=self._env(count), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ) for count in COUNTS}
        deadline = time.monotonic() + RECORDING_TIMEOUT_S
        try:
            for proc in running.values():
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        finally:
            for proc in running.values():
                proc.kill()
                proc.wait()
        return {count: Recording(
            slots=msgspec.json.decode(self._slots(count).read_bytes()),
            calls=msgspec.msgpack.decode(self._calls(count).read_bytes()),
        ) for count in COUNTS}

    def _env(self, count: int) -> dict[str, str]:
        env = {**os.environ, "CARMY_SLOT_REPORT": str(self._slots(count)), "CARMY_SLOT_CALLS": str(self._calls(count)),
               "CARMY_SLOT_PARTITIONS": str(count)}
        env.pop("CARMY_REDIS_PARTITIONS", None)  # the recorder's count, whatever this session's
        return env

    def _slots(self, count: int) -> Path:
        return self._tmp / f"slots-{count}.json"

    def _calls(self, count: int) -> Path:
        return self._tmp / f"calls-{count}.msgpack"
