"""``bin/run``, the one command that runs Carmy without Docker, as a person runs it: a worker
killed while it serves is started again (as compose's ``restart: unless-stopped`` does), so the
README's faults can be tried on it; a worker that cannot start stops everything with its status
instead of starting again forever; SIGTERM stops every process it started, and Ctrl-C too, its
private Redis last, so that the workers' drained executions are recorded and answered."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import ROOT, Stack, free_port, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def children(run: subprocess.Popen[bytes], role: str) -> list[int]:
    """The pids of ``bin/run``'s processes running ``role`` (``carmy_worker``, ``api`` or ``redis-server``)."""
    pattern = role if role == "redis-server" else f"python -m {role}"
    found = subprocess.run(["pgrep", "-P", str(run.pid), "-f", pattern], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


@pytest.fixture
def bin_run(stack: Stack) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    env = stack.env({"CARMY_PORT": str(port), "CARMY_WORKERS": "1", "CARMY_TOOLS": "tests.toolsets.basic"})
    log = open(stack.tmp / "bin-run.log", "wb")  # noqa: SIM115 (closed below)
    run = subprocess.Popen([str(ROOT / "bin" / "run")], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        yield run, f"http://127.0.0.1:{port}"
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        log.close()


def ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_killed_worker_is_started_again_and_sigterm_stops_everything(
        bin_run: tuple[subprocess.Popen[bytes], str]) -> None:
    run, base = bin_run
    wait_until(lambda: ready(base) and len(children(run, "carmy_worker")) == 1, 60)
    [first] = children(run, "carmy_worker")
    # Past bin/run's first seconds, where a stop means "could not start" and stops everything.
    wait_until(lambda: _ran_for(first) > 11, 30)
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: len(children(run, "carmy_worker")) == 1 and children(run, "carmy_worker") != [first], 30)
    # The new worker serves: a call is answered.
    wait_until(lambda: _echo(base) == 200, 60)
    assert run.poll() is None

    everyone = children(run, "carmy_worker") + children(run, "api")
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 143
    for pid in everyone:
        assert not _alive(pid), f"{pid} outlived bin/run"


def test_a_worker_that_cannot_start_stops_everything(stack: Stack) -> None:
    env = stack.env({"CARMY_PORT": str(free_port()), "CARMY_WORKERS": "1", "CARMY_TOOLS": "no_such_module_here"})
    began = time.monotonic()
    run = subprocess.run([str(ROOT / "bin" / "run")], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, start_new_session=True)
    assert run.returncode != 0
    assert "stopped" in run.stderr and "stopping everything" in run.stderr
    assert "starting another" not in run.stderr
    assert time.monotonic() - began < 120


def test_ctrl_c_lets_a_running_call_finish_and_be_answered_before_its_private_redis_stops(
        stack: Stack, tmp_path: Path) -> None:
    # bin/run with its own Redis, from a launcher of its own so that the data (var/redis) is this test's.
    root = tmp_path / "checkout"
    (root / "bin").mkdir(parents=True)
    for name in ("run", "lib.sh"):
        shutil.copy2(ROOT / "bin" / name, root / "bin" / name)
    for name in ("api", "carmy_worker", "examples", "tests", "pyproject.toml"):
        (root / name).symlink_to(ROOT / name)
    (root / ".venv").mkdir()
    for name in ("bin", "lib", "pyvenv.cfg"):  # the checkout's virtualenv, as is: nothing is installed
        (root / ".venv" / name).symlink_to(ROOT / ".venv" / name)
    (root / ".venv" / ".installed-base").touch()
    port = free_port()
    env = stack.env({"CARMY_PORT": str(port), "CARMY_REDIS_PORT": str(free_port()), "CARMY_WORKERS": "1",
                     "CARMY_TOOLS": "tests.toolsets.basic"})
    del env["CARMY_REDIS_URL"]
    base = f"http://127.0.0.1:{port}"
    with open(stack.tmp / "bin-run-own-redis.log", "wb") as log:
        # A session of its own, as a terminal gives the command it runs: Ctrl-C signals its group.
        run = subprocess.Popen([str(root / "bin" / "run")], cwd=root, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
        redis: list[int] = []
        try:
            wait_until(lambda: ready(base), 60)
            redis = children(run, "redis-server")
            answer: list[httpx.Response] = []
            call = threading.Thread(target=lambda: answer.append(httpx.post(
                f"{base}/agent/execute", json={"tool": "linger", "arguments": {"seconds": 2, "tag": "ctrl-c"}},
                timeout=60)))
            call.start()
            wait_until(lambda: (stack.tmp / "linger-start-ctrl-c").exists(), 30)
            os.killpg(run.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
            call.join(60)
            assert answer and answer[0].status_code == 200, answer and answer[0].text
            assert answer[0].json()["status"] == "completed"
            assert run.wait(timeout=60) == 130
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
            for pid in redis:  # in a process group of its own: the group's SIGKILL above misses it
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)


def _echo(base: str) -> int:
    try:
        return httpx.post(f"{base}/agent/execute", json={"tool": "echo", "arguments": {"text": "hi"}},
                          timeout=10).status_code
    except httpx.HTTPError:
        return 0


def _ran_for(pid: int) -> float:
    """Seconds since process ``pid`` started."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - ticks / os.sysconf("SC_CLK_TCK")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
