"""``python -m bench.upkeep [--seconds 15] [--streams 0,1000,10000] [--partitions P] [--out DIR]``: what
the processes do each second, with no call being made, beside N idle SSE streams on one API
process (issue 35, bench/README.md "Redis's upkeep beside idle streams").

Starts a private redis-server, one API and one worker with a slot for every stream (as the
``cost_idle`` row does), holds N streams of ``bench.tools.idle`` open (``bench.crowd``), and for
each N prints, over a quiet window: each process's CPU per second (Redis's, the API's, the
worker's), each script's calls and µs per second from a SLOWLOG that logged every command (so
one HEARTBEAT's cost can be read), and the longest pauses a PING sent every millisecond met. The
``cost_idle`` row gives what the streams do to a call's latency and CPU; this says which periodic
work grows with them. With ``--partitions`` P (``CARMY_REDIS_PARTITIONS``, on the one Redis) the
worker's beat is P scripts, each over the executions it holds in its partition.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import tempfile
import time
from pathlib import Path

import redis

from bench.crowd import hold_streams, raise_fd_limit
from bench.processes import RedisServer
from bench.procs import Processes, cpu_seconds
from bench.profile import slowlog_per_execution
from carmy_worker.store import keys

PROBE_S = 5.0  # the PING probe's window
PAUSE_MS = 5.0  # a PING slower than this is a pause worth listing


def idle_cpu_ms_per_s(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Each process's CPU over the same ``seconds`` of waiting, in ms per second."""
    before, started = {name: cpu_seconds(pid) for name, pid in pids.items()}, time.monotonic()
    time.sleep(seconds)
    took = time.monotonic() - started
    return {name: (cpu_seconds(pid) - before[name]) / took * 1000 for name, pid in pids.items()}


def scripts_per_s(client: redis.Redis, seconds: float) -> list[tuple[str, float, float]]:
    """Each command's (EVALSHA by script) calls and µs per second, from a SLOWLOG of everything."""
    client.config_set("slowlog-max-len", 1_000_000)
    client.slowlog_reset()
    client.config_set("slowlog-log-slower-than", 0)
    time.sleep(seconds)
    client.config_set("slowlog-log-slower-than", -1)
    rows = slowlog_per_execution(client, max(1, round(seconds)))
    client.slowlog_reset()
    return rows


def pauses_ms(client: redis.Redis, seconds: float) -> tuple[int, list[float]]:
    """PINGs sent every ms for ``seconds``: how many, and the round trips above ``PAUSE_MS``."""
    count, slow, end = 0, [], time.monotonic() + seconds
    while time.monotonic() < end:
        sent = time.perf_counter()
        client.ping()
        took = (time.perf_counter() - sent) * 1000
        count += 1
        if took > PAUSE_MS:
            slow.append(round(took, 1))
        time.sleep(0.001)
    return count, slow


def report(server: RedisServer, others: dict[str, int], streams: int, seconds: float) -> None:
    cpu = idle_cpu_ms_per_s({"Redis": server.proc.pid, **others}, seconds)
    with server.client() as client:
        scripts = scripts_per_s(client, seconds)
        pings, slow = pauses_ms(client, PROBE_S)
    print(f"\n## {streams:,} streams: CPU with no call made, " +
          ", ".join(f"{name} {ms:.1f} ms/s" for name, ms in cpu.items()) + "\n")
    print("| command | calls/s | µs/s | µs each |\n|---|--:|--:|--:|")
    for name, calls, usec in scripts:
        if usec >= 10 and not name.startswith("("):
            print(f"| {name} | {calls:.2f} | {usec:,.0f} | {usec / calls:,.0f} |")
    print(f"\n{pings:,} PINGs in {PROBE_S:g} s; over {PAUSE_MS:g} ms: {sorted(slow, reverse=True) or 'none'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.upkeep", description=__doc__.split("\n\n")[0])
    # 15 s, the API's keep-alive period (ApiSettings.sse_keepalive): a window that long holds
    # each stream's keep-alive once, whenever the streams were opened.
    parser.add_argument("--seconds", type=float, default=15.0, help="each quiet window (default 15)")
    parser.add_argument("--streams", default="0,1000,10000", help="the sizes, comma-separated")
    parser.add_argument("--partitions", type=int, default=1, help="CARMY_REDIS_PARTITIONS of the API and worker")
    parser.add_argument("--out", type=Path, default=None, help="where the processes' files go")
    args = parser.parse_args(argv)
    keys.use_partitions(args.partitions)
    spread = {"CARMY_REDIS_PARTITIONS": str(args.partitions)}
    sizes = [int(n) for n in args.streams.split(",")]
    workdir = args.out or Path(tempfile.mkdtemp(prefix="carmy-upkeep-"))
    raise_fd_limit()
    server = RedisServer(workdir)
    server.start()
    try:
        with Processes(workdir, server.url, "upkeep") as procs:
            worker = procs.carmy_worker(env={"CARMY_CONCURRENCY": str(max(sizes) + 100), **spread})
            api, base = procs.carmy_api(env={"CARMY_MAX_PENDING": str(max(sizes) * 2 + 100),
                                             "CARMY_QUEUE_TIMEOUT": "900", **spread})
            others = {"API": api.pid, "worker": worker.pid}
            for streams in sizes:
                if streams == 0:
                    report(server, others, 0, args.seconds)
                    continue
                asyncio.run(hold_streams(base, streams, api.pid, worker.pid,
                                         functools.partial(report, server, others, streams, args.seconds)))
                for partition in keys.partitions():  # the streams' executions ended
                    server.wait_settled(keys.pending(partition), timeout=180)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
