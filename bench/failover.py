"""What a Redis failover costs, with and without WAIT: ``python -m bench.failover [--wait 0 1] [--lag 0 0.3]``.

A primary, two replicas and three Sentinels on loopback; an API and two workers on the Sentinel
URL (``redis+sentinel://``). Agents call ``ledger`` (not idempotent: each run appends a line to
a file outside Redis), each call with a request_id of its own, back to back, and the primary is
killed mid-load. With ``--lag``, the replicas stop taking the primary's writes that many seconds
before the kill, as replicas behind a slow link would be: each is told to replicate from a port
where nothing listens, so it keeps what it had and takes nothing more (pausing the process
would not do: what the primary sent waits in its socket, and is read after the kill). On
loopback, without it, replication is all but instant. Once a replica is promoted, the load
goes on a little, then every request is retried with its request_id (until it is answered other
than 503), and counted:

* lost: answered the first time, and the retry did not replay that answer (another execution,
  or none: the store forgot the request);
* flipped: the retry names the same execution but answers something else;
* run twice: the ledger has more than one line for the request;
* refused: 503 the first time (nothing recorded: the retry runs it); no answer: the first call
  got none within 20 s (an execution the store lost while its caller waited).

It prints one markdown row per setting of ``CARMY_REDIS_WAIT_REPLICAS`` and lag.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.processes import ReplicatedRedis, free_port
from bench.procs import Processes

AGENTS = 32  # calls in flight at any time
BEFORE_S = 3.0  # load before the kill
AFTER_S = 3.0  # load after the Sentinels agree on the new primary
CALL_TIMEOUT_S = 20.0


@dataclass
class Answer:
    sent: float
    status: int
    code: str | None
    execution_id: str | None
    body: bytes


@dataclass
class Run:
    first: dict[str, Answer | None] = field(default_factory=dict)
    retry: dict[str, Answer | None] = field(default_factory=dict)
    killed: float = 0.0
    failover_s: float = 0.0


async def call(client: httpx.AsyncClient, base: str, request: str) -> Answer | None:
    sent = time.monotonic()
    try:
        r = await client.post(base + "/agent/execute", timeout=CALL_TIMEOUT_S, json={
            "tool": "ledger", "arguments": {"request": request}, "request_id": request})
    except httpx.HTTPError:
        return None
    body = r.json()
    return Answer(sent, r.status_code, body.get("error", {}).get("code"), body.get("execution_id"), r.content)


async def agent(client: httpx.AsyncClient, base: str, name: str, run: Run, stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set():
        request = f"{name}-{n}"
        n += 1
        run.first[request] = None
        answer = run.first[request] = await call(client, base, request)
        if answer is None or answer.status == 503:
            await asyncio.sleep(0.05)  # no busy loop while the store is away


async def retry(client: httpx.AsyncClient, base: str, request: str, run: Run, slots: asyncio.Semaphore) -> None:
    async with slots:
        for _ in range(40):
            answer = await call(client, base, request)
            run.retry[request] = answer
            if answer is not None and answer.status != 503:
                return
            await asyncio.sleep(0.5)


async def load(group: ReplicatedRedis, base: str, lag: float) -> Run:
    run, stop = Run(), asyncio.Event()
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=None)) as client:
        agents = [asyncio.create_task(agent(client, base, f"a{i}", run, stop)) for i in range(AGENTS)]
        await asyncio.sleep(BEFORE_S - lag)
        if lag:
            nowhere = free_port()
            for replica in group.replicas:
                with replica.client() as detach:
                    detach.replicaof("127.0.0.1", nowhere)
        await asyncio.sleep(lag)
        old = group.primary.port
        run.killed = time.monotonic()
        group.primary.kill()
        await asyncio.to_thread(group.wait_failover, old, 60.0)
        run.failover_s = time.monotonic() - run.killed
        await asyncio.sleep(AFTER_S)
        stop.set()
        await asyncio.gather(*agents)
        slots = asyncio.Semaphore(AGENTS)
        await asyncio.gather(*(retry(client, base, request, run, slots) for request in run.first))
    return run


def count(run: Run, ledger: Path) -> dict[str, object]:
    runs = Counter(line.split()[0] for line in ledger.read_text().splitlines()) if ledger.exists() else Counter()
    c: Counter[str] = Counter()
    for request, first in run.first.items():
        again = run.retry.get(request)
        c["sent"] += 1
        if first is None:
            c["no answer"] += 1
        elif first.status == 503:
            c["refused"] += 1
        else:
            c["answered"] += 1
            if again is None or again.status == 503 or again.execution_id != first.execution_id:
                c["lost"] += 1
            elif (again.status, again.body) != (first.status, first.body):
                c["flipped"] += 1
        if runs[request] > 1:
            c["run twice"] += 1
    back = [a.sent for a in run.first.values() if a and a.status == 200 and a.sent > run.killed]
    return {**c, "failover_s": run.failover_s, "unavailable_s": (min(back) - run.killed) if back else None}


def measure(wait_replicas: int, lag: float, workdir: Path) -> dict[str, object]:
    group = ReplicatedRedis(workdir, replicas=2)
    group.start()
    env = {"CARMY_REDIS_WAIT_REPLICAS": str(wait_replicas), "BENCH_MARKS": str(workdir)}
    try:
        with Processes(workdir, group.url, f"wait{wait_replicas}") as procs:
            for _ in range(2):
                procs.carmy_worker(env=env)
            _, base = procs.carmy_api(env, tool="ledger")
            run = asyncio.run(load(group, base, lag))
    finally:
        group.stop()
    return count(run, workdir / "ledger")


COLUMNS = ("sent", "answered", "refused", "no answer", "lost", "flipped", "run twice")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__.split("\n")[0])
    parser.add_argument("--wait", type=int, nargs="+", default=[0, 1], help="CARMY_REDIS_WAIT_REPLICAS values")
    parser.add_argument("--lag", type=float, nargs="+", default=[0.0, 0.3],
                        help="seconds the replicas stop taking writes before the kill")
    parser.add_argument("--runs", type=int, default=1, help="runs of each")
    args = parser.parse_args()
    print("| WAIT replicas | replica lag (s) | " + " | ".join(COLUMNS)
          + " | failover (s) | first 200 sent after the kill (s) |")
    print("|---" * (len(COLUMNS) + 4) + "|")
    for lag in args.lag:
        for wait_replicas in args.wait:
            for _ in range(args.runs):
                report(wait_replicas, lag)


def report(wait_replicas: int, lag: float) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="carmy-failover-"))
    try:
        row = measure(wait_replicas, lag, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    unavailable = row["unavailable_s"]
    print(f"| {wait_replicas} | {lag:g} | " + " | ".join(str(row.get(c, 0)) for c in COLUMNS)
          + f" | {row['failover_s']:.1f} | "
          + (f"{unavailable:.1f}" if isinstance(unavailable, float) else "-") + " |", flush=True)


if __name__ == "__main__":
    main()
