"""Hundreds of executions in flight on one API process: what it costs that process.

While the calls wait on a slow tool, the API's resident memory and its TCP connections are
read from /proc (its socket inodes matched against /proc/net/tcp), and its Redis connections
are cross-checked with Redis's own CLIENT LIST.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field

import httpx
import redis

from bench.processes import status_kib

ESTABLISHED = "01"


@dataclass
class Peak:
    """The largest values seen over the samples taken while the calls were in flight."""

    rss_mib: float = 0.0
    redis_connections: int = 0  # from /proc: the API's sockets connected to the Redis port
    redis_clients: int = 0  # from CLIENT LIST: clients whose address is one of those sockets
    http_connections: int = 0  # the API's accepted connections: calls in flight
    samples: int = 0


@dataclass
class InflightResult:
    calls: int
    ok: int
    peak: Peak
    hwm_mib: float  # VmHWM: the API's peak RSS over its whole life
    failures: list[str] = field(default_factory=list)


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def tcp_connections(pid: int) -> list[tuple[int, int]]:
    """(local port, remote port) of the established TCP connections that ``pid`` holds."""
    mine = socket_inodes(pid)
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            next(f)  # header
            for line in f:
                cols = line.split()
                if cols[3] == ESTABLISHED and cols[9] in mine:
                    found.append((int(cols[1].rsplit(":", 1)[1], 16), int(cols[2].rsplit(":", 1)[1], 16)))
    return found


def sample(pid: int, api_port: int, redis_port: int, redis_client: redis.Redis, peak: Peak) -> None:
    conns = tcp_connections(pid)
    to_redis = {local for local, remote in conns if remote == redis_port}
    listed: list[dict[str, str]] = redis_client.client_list()  # type: ignore[assignment]  # sync client
    clients = sum(1 for c in listed if int(c["addr"].rsplit(":", 1)[1]) in to_redis)
    peak.rss_mib = max(peak.rss_mib, status_kib(pid, "VmRSS") / 1024)
    peak.redis_connections = max(peak.redis_connections, len(to_redis))
    peak.redis_clients = max(peak.redis_clients, clients)
    peak.http_connections = max(peak.http_connections, sum(1 for local, _ in conns if local == api_port))
    peak.samples += 1


async def hold(base: str, api_pid: int, redis_url: str, *, calls: int, tool: str) -> InflightResult:
    """Fire ``calls`` concurrent calls of ``tool``; sample the API every 50 ms until all answer."""
    api_port = int(base.rsplit(":", 1)[1])
    redis_client = redis.Redis.from_url(redis_url)
    redis_port = redis_client.connection_pool.connection_kwargs["port"]
    peak = Peak()
    limits = httpx.Limits(max_connections=calls + 10, max_keepalive_connections=calls + 10)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
        tasks = [asyncio.create_task(client.post("/agent/execute", json={"tool": tool, "arguments": {}}))
                 for _ in range(calls)]
        while not all(t.done() for t in tasks):
            sample(api_pid, api_port, redis_port, redis_client, peak)
            await asyncio.sleep(0.05)
        answers = await asyncio.gather(*tasks, return_exceptions=True)
    redis_client.close()
    result = InflightResult(calls=calls, ok=0, peak=peak, hwm_mib=status_kib(api_pid, "VmHWM") / 1024)
    for answer in answers:
        if isinstance(answer, httpx.Response) and answer.status_code == 200 \
                and answer.json().get("status") == "completed":
            result.ok += 1
        elif len(result.failures) < 5:
            result.failures.append(repr(answer) if not isinstance(answer, httpx.Response)
                                   else f"{answer.status_code} {answer.text[:200]}")
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.inflight [--calls 500 5000]``: each count of calls in flight at once on
    one API process (one worker running ``sleep2s`` with room for them all), as ``bin/bench`` does."""
    import argparse
    import tempfile
    from pathlib import Path

    from bench.processes import RedisServer
    from bench.procs import Processes

    parser = argparse.ArgumentParser(prog="python -m bench.inflight", description=main.__doc__)
    parser.add_argument("--calls", type=int, nargs="+", default=[500], help="calls in flight (one run each)")
    parser.add_argument("--tool", default="sleep2s")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="carmy-inflight-"))
    server = RedisServer(workdir)
    server.start()
    failed = 0
    try:
        for calls in args.calls:
            with Processes(workdir, server.url, f"inflight-{calls}") as procs:
                procs.carmy_worker(env={"CARMY_CONCURRENCY": str(calls + 100)})
                api, base = procs.carmy_api(env={"CARMY_MAX_PENDING": str(calls * 4)}, tool=args.tool)
                r = asyncio.run(hold(base, api.pid, server.url, calls=calls, tool=args.tool))
            p = r.peak
            print(f"{calls} in flight: {r.ok} answered 200 completed; API RSS peak {p.rss_mib:.1f} MiB "
                  f"(VmHWM {r.hwm_mib:.1f}), Redis connections {p.redis_connections} (CLIENT LIST {p.redis_clients}), "
                  f"HTTP connections {p.http_connections}, {p.samples} samples", flush=True)
            for failure in r.failures:
                print(f"  failure: {failure}")
            failed += r.ok != calls
            server.flush()
    finally:
        server.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
