"""The load: clients that make calls with fresh request ids, each retried with the same
request id (and the same arguments) until it has a final answer or the patience runs out; and,
with shares of their turns, jobs, webhook deliveries, streams without a request id and calls of
an imported tool.

Every call goes over a fresh connection (no keep-alive): a retry after a server died must not
reuse a connection to it. Retries back off exponentially with jitter and move to the next API
replica, as a client behind a load balancer would.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Literal

import httpx

from chaos.calls import REFUSAL_CODES, attempt
from chaos.model import Mode, Request

if TYPE_CHECKING:
    from chaos.hookload import HookLoad
    from chaos.imported import ImportedLoad
    from chaos.jobload import JobLoad
    from chaos.streams import StreamLoad

# The call mix: (tool, share, work in ms). Slow work keeps executions in flight when a fault
# hits; quick work makes calls many.
MIX: tuple[tuple[str, float, tuple[int, int]], ...] = (
    ("charge", 0.30, (20, 500)),
    ("charge_sync", 0.15, (20, 500)),
    ("put", 0.20, (0, 20)),
    ("put_sync", 0.15, (20, 300)),
    ("serial", 0.20, (10, 80)),
)
MODES: tuple[tuple[Mode, float], ...] = (("json", 0.5), ("sse", 0.25), ("async", 0.25))
ATTEMPT_S = 30.0  # longest single attempt; a wait past it is retried (the execution is joined)
# Every this many calls, one carries arguments over the size that is staged (store.staging.STAGE_BYTES),
# and gets them back in its result: the staged SETs, and the SUBMIT and SETTLE that rename them,
# meet the faults too.
# Chosen by the call's number, not drawn, so a seed's mix of tools is what it was.
LARGE_EVERY = 40
PAD_BYTES = 80 * 1024


def new_client() -> httpx.Client:
    """One client for all threads (thread-safe); building one per call would cost CPU."""
    return httpx.Client(limits=httpx.Limits(max_connections=None, max_keepalive_connections=0))


class Load:
    """``clients`` threads calling until ``stop``; ``burst`` adds n one-off calls at once. With
    ``jobs``, a share of the clients' turns creates a job instead of making a call."""

    def __init__(self, bases: list[str], clients: int, seed: int, patience: float, run_id: str,
                 jobs: JobLoad | None = None, hooks: HookLoad | None = None, streams: StreamLoad | None = None,
                 imported: ImportedLoad | None = None) -> None:
        self.bases = bases
        self.jobs = jobs
        self.hooks = hooks
        self.streams = streams
        self.imported = imported
        self.clients = clients
        self.seed = seed
        self.patience = patience
        self.run_id = run_id
        self.requests: list[Request] = []
        self.stop = threading.Event()
        self.client = new_client()
        self._ids: Iterator[int] = itertools.count()
        self._ids_lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self.clients):
            thread = threading.Thread(target=self._client, args=(random.Random(self.seed * 7919 + i),),
                                      name=f"client-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def burst(self, n: int) -> float:
        """Starts ``n`` calls at once, each in a thread of its own; returns once all are sent."""
        rng = random.Random(self.seed * 104729 + len(self.requests))
        requests = [self._new(rng, "burst") for _ in range(n)]
        gate = threading.Barrier(n + 1)

        def one(i: int, request: Request) -> None:
            gate.wait()
            self._call(request, self.bases[i % len(self.bases)], "json")

        for i, request in enumerate(requests):
            thread = threading.Thread(target=one, args=(i, request), daemon=True)
            thread.start()
            self._threads.append(thread)
        gate.wait()
        return time.time()

    def finish(self, timeout: float) -> None:
        """Stops new calls and waits (at most ``timeout`` s) for those in flight to end."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _new(self, rng: random.Random, kind: Literal["load", "burst"]) -> Request:
        tool, work = pick_tool(rng, kind)
        with self._ids_lock:
            n = next(self._ids)
        args = {"ms": work}
        if n % LARGE_EVERY == LARGE_EVERY - 1:
            args["pad"] = PAD_BYTES  # the size: chaos.calls sends that many bytes of padding
        request = Request(rid=f"{self.run_id}-{n}", tool=tool, args=args, kind=kind, first=time.time())
        self.requests.append(request)  # list.append is atomic under the GIL
        return request

    def _client(self, rng: random.Random) -> None:
        while not self.stop.is_set():
            if self.jobs is not None and rng.random() < self.jobs.share:
                self.jobs.create(rng, self.bases[rng.randrange(len(self.bases))])
                continue
            if self.hooks is not None and rng.random() < self.hooks.share:
                self.hooks.deliver(rng, self.bases[rng.randrange(len(self.bases))])
                continue
            if self.streams is not None and rng.random() < self.streams.share:
                self.streams.call(self.client, rng, self.bases[rng.randrange(len(self.bases))])
                continue
            if self.imported is not None and rng.random() < self.imported.share:
                self.imported.call(self.client, rng, self.bases[rng.randrange(len(self.bases))])
                continue
            request = self._new(rng, "load")
            mode = pick_mode(rng)
            self._call(request, self.bases[rng.randrange(len(self.bases))], mode)

    def _call(self, request: Request, base: str, mode: Mode) -> None:
        """Retries ``request`` until a final answer or a final refusal, or the patience is over."""
        retry_call(self.client, self.bases, request, mode, base, request.first + self.patience)


def pick_mode(rng: random.Random) -> Mode:
    """How a call is made, by ``MODES``' shares."""
    return rng.choices([m for m, _ in MODES], [w for _, w in MODES])[0]


def pick_tool(rng: random.Random, kind: Literal["load", "burst"]) -> tuple[str, int]:
    if kind == "burst":  # quick calls: the burst is about concurrency, not work
        return rng.choice(["put", "charge"]), rng.randint(0, 20)
    tool, _, (low, high) = rng.choices(MIX, [share for _, share, _ in MIX])[0]
    return tool, rng.randint(low, high)


def retry_call(client: httpx.Client, bases: list[str], request: Request, mode: Mode, base: str,
               deadline: float, phase: Literal["load", "final"] = "load") -> None:
    """Attempts until a final answer, a refusal no retry would change, or ``deadline`` (wall clock)."""
    backoff = 0.1
    while True:
        remaining = deadline - time.time()
        if remaining <= 0:
            return
        result = attempt(client, base, request, mode, min(remaining, ATTEMPT_S))
        result.phase = phase
        request.attempts.append(result)
        if result.answer is not None or result.code in REFUSAL_CODES:
            return
        if result.error is not None or (result.http or 0) >= 500:
            base = bases[(bases.index(base) + 1) % len(bases)]
        time.sleep(min(backoff * random.uniform(0.5, 1.5), max(0.0, deadline - time.time())))
        backoff = min(backoff * 2, 2.0)


def final_retries(bases: list[str], requests: list[Request], each: float) -> None:
    """Asks again for every request, with its request id, as the reconciliation's last word:
    a replay of what was recorded, or (for a request never accepted) its first run. Each
    request has ``each`` seconds from its turn, however many came before it."""
    client = new_client()

    def one(pair: tuple[int, Request]) -> None:
        i, request = pair
        retry_call(client, bases, request, "json", bases[i % len(bases)], time.time() + each, phase="final")

    with client, ThreadPoolExecutor(32) as pool:
        list(pool.map(one, enumerate(requests)))
