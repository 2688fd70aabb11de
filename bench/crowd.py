"""Idle SSE streams held open on one API process (issue 35's idle connections): what each costs
the API and the worker in memory, and what they do to the latency of other calls.

Each stream is a raw asyncio connection that posts a streamed call of ``bench.tools.idle`` (it
sleeps until cancelled) and reads the response's head; then it stays open, quiet but for the
API's keep-alive comments. Opened a few hundred at a time: the listen backlog is finite.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from bench import latency
from bench.processes import status_kib

OPENING_AT_ONCE = 200


def raise_fd_limit() -> int:
    """The soft limit on open files raised to the hard one (our children inherit it): 10,000
    streams are 10,000 sockets in the client and as many in the API."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


@dataclass(frozen=True)
class Held:
    streams: int
    api_kib_per_stream: float  # VmRSS growth over the streams
    worker_kib_per_stream: float


async def _open(host: str, port: int, request: bytes, gate: asyncio.Semaphore,
                held: list[asyncio.StreamWriter]) -> None:
    async with gate:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            writer.close()
            raise RuntimeError(f"an idle stream was answered {head[:200]!r}")
        held.append(writer)


async def hold_streams(base: str, count: int, api_pid: int, worker_pid: int,
                       during: Callable[[], None]) -> Held:
    """Open ``count`` streams, read both processes' memory, run ``during()`` (a blocking callable:
    the other calls' measurement) in a thread, then close the streams."""
    url = urlsplit(base)
    request = latency.sse_request(url.netloc, {"tool": "idle", "arguments": {}})
    api_before, worker_before = status_kib(api_pid, "VmRSS"), status_kib(worker_pid, "VmRSS")
    held: list[asyncio.StreamWriter] = []
    gate = asyncio.Semaphore(OPENING_AT_ONCE)
    try:
        await asyncio.gather(*(_open(url.hostname or "127.0.0.1", url.port or 80, request, gate, held)
                               for _ in range(count)))
        await asyncio.sleep(1)  # every execution started in the worker, its task parked
        api_after, worker_after = status_kib(api_pid, "VmRSS"), status_kib(worker_pid, "VmRSS")
        await asyncio.to_thread(during)
    finally:
        for writer in held:
            writer.close()
    return Held(count, (api_after - api_before) / count, (worker_after - worker_before) / count)
