"""The processes a test run starts do not outlive it, even when it is killed and never gets to
stop them: a run beside it would otherwise share the machine with stray servers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, wait_until

# A test run in miniature: starts a redis-server and a worker-like child, prints their pids,
# then is killed (SIGKILL: no cleanup of any kind).
RUN = """
import signal, sys, time
from pathlib import Path
from bench.processes import Proc, RedisServer
workdir = Path(sys.argv[1])
redis = RedisServer(workdir)
redis.start()
child = Proc("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], {}, workdir / "sleeper.log")
print(redis.proc.pid, child.pid, flush=True)
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def test_children_die_with_a_killed_run(tmp_path: Path) -> None:
    run = subprocess.Popen([sys.executable, "-c", RUN, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                           text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.stdout is not None
    pids = [int(p) for p in run.stdout.readline().split()]
    try:
        assert len(pids) == 2 and all(alive(p) for p in pids)
        run.kill()
        run.wait(10)
        wait_until(lambda: not any(alive(p) for p in pids), 10, "the children of the killed run exiting")
    finally:
        run.kill()
        run.stdout.close()
        for pid in pids:  # if they did outlive it, this test must not leave them behind either
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
