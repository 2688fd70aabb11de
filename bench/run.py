"""``python -m bench.run [--quick] [--json FILE] [--rounds N]``: run every benchmark scenario on
this machine and print one markdown report (see bench/README.md).

The scenarios whose rows the targets compare as ratios (``scenarios.ROUNDED``: Carmy, bare
Starlette, the shape's floor) are played first, ``--rounds`` times, one after the other in each
round, and the report gives each of their rows' medians, each ratio's median over the rounds that
measured both sides, and its range: on these machines one round's ratio moves by a tenth or more.

Exits 1 when something failed to respond (an error, a non-200, a process that did not start);
missing a performance target is reported, not an error: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python bench/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import scenarios, wrk
from bench.processes import ROOT, RedisServer
from bench.report import Report, median_row


def command_output(*args: str) -> str:
    """The first line a command prints (stdout, else stderr), "" when it prints nothing or fails."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = (done.stdout.strip() or done.stderr.strip()).splitlines()
    return lines[0] if lines else ""


def header(config: scenarios.Config, quick: bool, rounds: int, only: list[str]) -> list[str]:
    rounded = [s.__name__ for s in scenarios.ROUNDED if not only or s.__name__ in only]
    commit = command_output("git", "rev-parse", "--short", "HEAD") or "unknown commit"
    if command_output("git", "status", "--porcelain", "--untracked-files=no"):
        commit += " (with uncommitted changes)"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    redis_version = command_output("redis-server", "--version").split(" sha=")[0]
    wrk_version = command_output("wrk", "--version").split(" [")[0]
    return [
        f"# Carmy benchmark{' (quick smoke run: numbers not meaningful)' if quick else ''}",
        "",
        f"- commit {commit}, {now}",
        f"- {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, Python {platform.python_version()}, "
        f"{redis_version}, {wrk_version}",
        f"- each load measurement: wrk for {config.seconds:g} s"
        + (f" after a {config.warmup:g} s warm-up" if config.warmup else "")
        + "; 1 client = wrk -t1 -c1, 64 clients = wrk -t2 -c64",
    ] + ([f"- {', '.join(rounded)}: played {rounds} times in turn; their rows are medians, their ratios the "
          "median of each round's (with the range)"] if rounds > 1 and rounded else [])


def preflight() -> str | None:
    """Why the benchmark cannot run here, or None."""
    if not wrk.available():
        return wrk.INSTALL_HINT
    if shutil.which("redis-server") is None:
        return "redis-server is not installed: apt-get install redis-server (Debian/Ubuntu)"
    return None


def run(config: scenarios.Config, quick: bool, only: list[str], rounds: int = 1) -> Report:
    report = Report(header=header(config, quick, rounds, only))
    workdir = Path(tempfile.mkdtemp(prefix="carmy-bench-"))
    redis = RedisServer(workdir)  # no persistence: disk writes never show in the numbers
    redis.start()
    bench = scenarios.Bench(config, workdir, redis, report)
    chosen = [s for s in scenarios.ALL if not only or s.__name__ in only]
    try:
        # The rounds first, back to back, so that they share the machine's conditions: played
        # after the rest, round 1 came ten minutes before the others, the 10,000 streams and the
        # million queued jobs of the cost curves between them.
        for index in range(rounds):
            mark = len(report.rows)
            for scenario in [s for s in chosen if s in scenarios.ROUNDED]:
                play(scenario, bench, f" (round {index + 1} of {rounds})" if rounds > 1 else "")
            if rounds > 1:
                report.rounds.append(report.rows[mark:])
        if report.rounds:
            report.rows = [median_row([row for rows in report.rounds for row in rows if row.key == first.key])
                           for first in report.rounds[0]]
        for scenario in [s for s in chosen if s not in scenarios.ROUNDED]:
            play(scenario, bench, "")
    finally:
        redis.stop()
    report.log_errors = bench.log_errors()
    report.header.append(f"- process logs: {workdir}")
    return report


def play(scenario: scenarios.Scenario, bench: scenarios.Bench, which: str) -> None:
    started = time.monotonic()
    print(f"… {scenario.__name__}{which}", file=sys.stderr, flush=True)
    try:
        scenario(bench)
    except Exception as exc:  # one broken scenario must not hide the others' numbers
        traceback.print_exc()
        bench.report.problems.append(f"{scenario.__name__}: {type(exc).__name__}: {exc}")
    print(f"  {scenario.__name__} took {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (about 100 s): checks everything answers")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    parser.add_argument("--only", action="append", default=[], choices=[s.__name__ for s in scenarios.ALL],
                        help="run only this scenario (repeatable)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="how many times to play the scenarios the targets' ratios compare "
                             "(default 3, and 1 with --quick)")
    args = parser.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    problem = preflight()
    if problem:
        print(f"bench: {problem}", file=sys.stderr)
        return 2
    report = run(scenarios.QUICK if args.quick else scenarios.FULL, args.quick, args.only, rounds)
    print(report.render())
    if args.json:
        args.json.write_text(json.dumps(dataclasses.asdict(report), indent=2))
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
