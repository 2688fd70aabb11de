"""The processes a benchmark scenario needs: our API and workers, the baselines' uvicorn and
arq workers, and what they cost in CPU. Starting processes, waiting for them and the private
redis-server are in bench/processes.py, which the tests share (bench/ does not import tests/)."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import httpx

from bench.processes import ROOT, Proc, on_free_port

START_TIMEOUT = 20.0  # seconds for a server to be ready

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used so far, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime and stime (fields 14, 15)


def machine_busy_seconds() -> float:
    """CPU time all CPUs of the machine spent busy so far (everything but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / CLOCK_TICKS  # user..steal, minus idle and iowait


def children_cpu_seconds() -> float:
    """CPU time used so far by this process's children that have exited (such as wrk runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class CpuMeter:
    """Percent of one core each process (and wrk, a reaped child) used inside the ``with``, and
    what the rest of the machine used meanwhile ("other": on a shared machine, noise)."""

    def __init__(self, procs: list[Proc]) -> None:
        self.procs = [p for p in procs if p.alive()]
        self.summary = ""
        self.seconds: dict[str, float] = {}  # CPU seconds used inside the ``with``, per kind of process

    def __enter__(self) -> CpuMeter:
        self._start = time.monotonic()
        self._before = [cpu_seconds(p.pid) for p in self.procs]
        self._children = children_cpu_seconds()
        self._machine = machine_busy_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        elapsed = time.monotonic() - self._start
        by_kind: dict[str, list[str]] = {}
        ours = children_cpu_seconds() - self._children  # wrk
        for proc, before in zip(self.procs, self._before, strict=True):
            if proc.alive():
                used = cpu_seconds(proc.pid) - before
                ours += used
                by_kind.setdefault(proc.kind, []).append(f"{used / elapsed:.0%}")
                self.seconds[proc.kind] = self.seconds.get(proc.kind, 0.0) + used
        by_kind["wrk"] = [f"{(children_cpu_seconds() - self._children) / elapsed:.0%}"]
        other = max(0.0, machine_busy_seconds() - self._machine - ours)
        by_kind["other"] = [f"{other / elapsed:.0%}"]
        self.summary = ", ".join(f"{kind} {'+'.join(shares)}" for kind, shares in by_kind.items())


def child_env(redis_url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child: ours minus any CARMY_* setting, plus the run's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARMY_")}
    env.update({"CARMY_REDIS_URL": redis_url, "BENCH_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT),
                "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def log_message(line: str) -> str:
    """The message of a JSON log line (without its traceback), or the line itself."""
    try:
        record = json.loads(line)
    except ValueError:
        return line
    return str(record.get("message", line)) if isinstance(record, dict) else line


class Processes:
    """Starts the servers of one scenario and stops them all when the scenario is over."""

    def __init__(self, workdir: Path, redis_url: str, scenario: str) -> None:
        self.workdir = workdir
        self.redis_url = redis_url
        self.scenario = scenario  # prefixes the log names, so scenarios keep their own logs
        self.procs: list[Proc] = []
        self._count = 0

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def log_errors(self) -> list[str]:
        """One line per process that logged errors: how many, and the first of them."""
        found = []
        for proc in self.procs:
            lines = proc.error_lines()
            if lines:
                found.append(f"{proc.name}: {len(lines)} error lines; first: {log_message(lines[0])[:300]}")
        return found

    def start(self, kind: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        self._count += 1
        name = f"{self.scenario}-{kind}-{self._count}"
        proc = Proc(name, args, child_env(self.redis_url, env), self.workdir / f"{name}.log", kind)
        self.procs.append(proc)
        return proc

    # Our stack --------------------------------------------------------------------------------

    def carmy_worker(self, module: str = "bench.tools", env: dict[str, str] | None = None) -> Proc:
        proc = self.start("worker", [sys.executable, "-m", "carmy_worker", module], env)
        proc.wait_for_log("serving", START_TIMEOUT)
        return proc

    def carmy_api(self, env: dict[str, str] | None = None, tool: str = "noop") -> tuple[Proc, str]:
        """``python -m api``, returned once its catalog lists ``tool`` (so the workers are known)."""
        def start(port: int) -> tuple[Proc, str]:
            proc = self.start("api", [sys.executable, "-m", "api"], {"CARMY_PORT": str(port), **(env or {})})
            base = f"http://127.0.0.1:{port}"
            proc.wait_for_http(base + "/.well-known/agent", START_TIMEOUT)
            return proc, base

        proc, base = on_free_port(start)
        proc.wait_ready(lambda: f'"name":"{tool}"' in httpx.get(base + "/agent/tools", timeout=1).text, 10,
                        f"its catalog listing {tool}")
        return proc, base

    # Baselines --------------------------------------------------------------------------------

    def uvicorn(self, app: str) -> tuple[Proc, str]:
        """A baseline app under uvicorn with the same options ``python -m api`` uses."""
        def start(port: int) -> tuple[Proc, str]:
            proc = self.start("uvicorn", [
                sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
                "--log-level", "warning", "--no-access-log", "--no-server-header", "--timeout-keep-alive", "5",
            ])
            base = f"http://127.0.0.1:{port}"
            proc.wait_for_http(base + "/health", START_TIMEOUT)
            return proc, base

        return on_free_port(start)

    def arq_worker(self) -> Proc:
        # arq's own CLI, as its documentation runs it.
        proc = self.start("arq", [sys.executable, "-m", "arq", "bench.baselines.ArqWorkerSettings"])
        proc.wait_for_log("Starting worker", START_TIMEOUT)
        return proc
