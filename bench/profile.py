"""``python -m bench.profile [--seconds 20] [--clients 64] [--workers 2] [--tool noop | --bytes N]
[--partitions 1] [--out DIR]``: where an execution's time goes, under the benchmark's load
(bench/README.md, "Where the time goes").

Starts a private redis-server, ``--workers`` workers of ``bench.tools`` and one API, drives
``POST /agent/execute`` (no-op, or with ``--bytes`` the echo tool with a body of N bytes) with wrk,
and meanwhile samples the API and the first worker with
``py-spy record`` (raw, collapsed stacks, idle frames left out). Prints, per process, the share
of its samples spent in each frame (inclusive), and the Redis commands per execution from
``INFO commandstats`` deltas (calls and µs of Redis CPU). Needs ``py-spy`` on PATH or in the venv.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from bench import wrk
from bench.cost_rows import BIG_RESULT
from bench.processes import RedisServer
from bench.procs import Processes, cpu_seconds
from bench.scenarios import WORKER_CONCURRENCY, execute
from bench.sizes import call, echo_arguments
from carmy_worker.store.scripts import Script


def commandstats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """Per command: (calls, usec) so far."""
    stats: dict[str, dict[str, int]] = client.info("commandstats")  # type: ignore[assignment]
    return {name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for name, v in stats.items()}


def per_execution(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
                  executions: int) -> list[tuple[str, float, float]]:
    rows = []
    for name, (calls, usec) in after.items():
        c0, u0 = before.get(name, (0, 0))
        if calls - c0:
            rows.append((name, (calls - c0) / executions, (usec - u0) / executions))
    return sorted(rows, key=lambda r: -r[2])


SCRIPT_MODULES = ("carmy_worker.store.attempts", "carmy_worker.store.audit", "carmy_worker.store.callbacks",
                  "carmy_worker.store.follow", "carmy_worker.store.janitor", "carmy_worker.store.jobstore",
                  "carmy_worker.store.leases", "carmy_worker.store.locks", "carmy_worker.store.mcpcalls",
                  "carmy_worker.store.progress", "carmy_worker.store.promotion", "carmy_worker.store.pulse",
                  "carmy_worker.store.reads",
                  "carmy_worker.store.roster", "carmy_worker.store.submit", "carmy_worker.store.verdicts")


def script_names() -> dict[str, str]:
    """SHA1 of every Lua script the code base registers (a module-level ``Script``) → its name."""
    names = {}
    for module_name in SCRIPT_MODULES:
        for value in vars(importlib.import_module(module_name)).values():
            if isinstance(value, Script):
                names[value.sha] = f"EVALSHA {value.name}"
    return names


def slowlog_per_execution(client: redis.Redis, executions: int) -> list[tuple[str, float, float]]:
    """Per command (EVALSHA split by script): calls and µs per execution, from a SLOWLOG that
    recorded every command (threshold 0) during the window. A script's time includes the
    commands it ran, which are listed apart (Redis logs them too, as from client ``?:0``)."""
    names = script_names()
    calls: collections.Counter[str] = collections.Counter()
    usec: collections.Counter[str] = collections.Counter()
    for entry in client.slowlog_get(1_000_000):  # type: ignore[union-attr]  # sync client
        command = entry["command"]
        args = (command.decode(errors="replace") if isinstance(command, bytes) else str(command)).split()[:2]
        name = args[0].upper() if args else "?"
        if name == "EVALSHA" and len(args) > 1:
            name = names.get(args[1], "EVALSHA ?")
        address = entry.get("client_address", b"")
        if (address.decode() if isinstance(address, bytes) else address) == "?:0":  # Lua's own client
            name = f"(inside scripts) {name}"
        calls[name] += 1
        usec[name] += entry["duration"]
    return sorted(((n, calls[n] / executions, usec[n] / executions) for n in calls),
                  key=lambda r: (r[0].startswith("("), -r[2]))


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    return found


def frames_share(raw: Path, top: int) -> list[tuple[str, float]]:
    """Inclusive share of samples per frame (function and file), from py-spy's collapsed output."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        samples = int(n)
        total += samples
        seen = set()
        for frame in stack.split(";"):
            name = frame.split(":")[0].strip()  # "func (file.py" without the line number
            if name not in seen:
                seen.add(name)
                counts[name] += samples
    return [(name, n / total) for name, n in counts.most_common(top)] if total else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tool", default="noop", help="a tool of bench.tools, e.g. sleep50 (the scale-out rows')")
    parser.add_argument("--bytes", type=int, default=0,
                        help="call the echo tool with a body of this many bytes instead (the cost_payload row's call)")
    parser.add_argument("--partitions", type=int, default=1,
                        help="CARMY_REDIS_PARTITIONS of every process (all on the one redis-server)")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=60)
    parser.add_argument("--no-spy", action="store_true", help="only the Redis and CPU figures")
    parser.add_argument("--out", type=Path, help="where to keep the raw profiles (default: a temporary directory)")
    args = parser.parse_args(argv)
    spy = "" if args.no_spy else py_spy()
    workdir = args.out or Path(tempfile.mkdtemp(prefix="carmy-profile-"))
    workdir.mkdir(parents=True, exist_ok=True)
    server = RedisServer(workdir)
    server.start()
    try:
        with Processes(workdir, server.url, "profile") as procs:
            partitions = {"CARMY_REDIS_PARTITIONS": str(args.partitions)}
            tool = "echo" if args.bytes else args.tool
            worker_env = {"CARMY_CONCURRENCY": str(WORKER_CONCURRENCY), **partitions,
                          **(BIG_RESULT if args.bytes else {})}
            workers = [procs.carmy_worker(env=worker_env) for _ in range(args.workers)]
            api, base = procs.carmy_api(env=partitions, tool=tool)
            request = call(tool, echo_arguments(args.bytes)) if args.bytes else execute(tool)
            wrk.run(base, request, clients=args.clients, seconds=2, workdir=workdir)  # warm-up
            targets = {"api": api, "worker": workers[0]}
            spies = {name: subprocess.Popen(
                [spy, "record", "--pid", str(p.pid), "--rate", str(args.rate), "--duration", str(int(args.seconds)),
                 "--format", "raw", "--nonblocking", "--output", str(workdir / f"{name}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name, p in targets.items() if spy}
            with server.client() as client:
                before = commandstats(client)
                cpu0 = {p.name: cpu_seconds(p.pid) for p in [*procs.procs, server.proc]}
                result = wrk.run(base, request, clients=args.clients, seconds=args.seconds, workdir=workdir)
                cpu1 = {p.name: cpu_seconds(p.pid) for p in [*procs.procs, server.proc]}
                after = commandstats(client)
            for spy_proc in spies.values():
                spy_proc.wait(60)
            with server.client() as client:  # every command of a short window, scripts by name
                client.config_set("slowlog-max-len", 1_000_000)
                client.config_set("slowlog-log-slower-than", 0)
                client.slowlog_reset()
                window = wrk.run(base, request, clients=args.clients, seconds=3, workdir=workdir)
                client.config_set("slowlog-log-slower-than", -1)
                scripts = slowlog_per_execution(client, window.requests)
    finally:
        server.stop()
    n = result.requests
    print(f"# {n} executions in {result.seconds:.1f} s: {result.rps:,.0f}/s, p50 {result.p50_ms:.2f} ms, "
          f"{result.errors} errors; profiles in {workdir}")
    print("\nCPU per execution (µs): " + ", ".join(f"{name} {(cpu1[name] - cpu0[name]) / n * 1e6:.0f}"
                                              for name in cpu0))
    rows = per_execution(before, after, n)
    print(f"\nRedis commands per execution: {sum(r[1] for r in rows):.2f} calls, {sum(r[2] for r in rows):.1f} µs")
    print("| command | calls | µs |\n|---|--:|--:|")
    for name, calls, usec in rows:
        print(f"| {name} | {calls:.3f} | {usec:.2f} |")
    print(f"\nThe same from SLOWLOG (every command, {window.requests} executions in 3 s: "
          f"{window.rps:,.0f}/s; Redis's own timing adds to each)")
    print("| command | calls | µs |\n|---|--:|--:|")
    for name, calls, usec in scripts:
        print(f"| {name} | {calls:.3f} | {usec:.2f} |")
    for name in targets:
        raw = workdir / f"{name}.txt"
        if not raw.exists():
            print(f"\n{name}: no profile")
            continue
        print(f"\n## {name}: inclusive share of samples (non-idle)")
        for frame, share in frames_share(raw, args.top):
            print(f"{share:6.1%}  {frame}")
    time.sleep(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
