"""Every caller that goes away cancels its execution, however many go at once: a thousand SSE and
JSON calls reset together cancel a thousand running tools, each seen cancelled by the tool itself
(counted in files, outside Redis)."""

from __future__ import annotations

import functools
import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import Stack, wait_until

CALLS = 1000
BATCH = 100
MOST = 0.95  # of the calls opened, the share whose tools must run (and then be cancelled)
TAG = "mass"


@pytest.fixture(scope="module")
def base(stack: Stack) -> Iterator[str]:
    # Two workers with room for every call at once, and an API that admits them all.
    for _ in range(2):
        stack.worker(env={"CARMY_CONCURRENCY": str(CALLS // 2 + 50)})
    _, url = stack.api({"CARMY_MAX_PENDING": str(2 * CALLS)})
    wait_until(lambda: "hold" in httpx.get(url + "/agent/tools").text)
    yield url


def open_call(base: str, *, sse: bool) -> socket.socket:
    """A call of ``hold`` on a socket of its own, its request sent and its answer never read."""
    host, port = base.removeprefix("http://").split(":")
    body = json.dumps({"tool": "hold", "arguments": {"seconds": 250, "tag": TAG}}).encode()
    accept = b"Accept: text/event-stream\r\n" if sse else b""
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(b"POST /agent/execute HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" + accept
                 + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0): the client is gone at once, without a goodbye."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def execution_ids(path: Path) -> list[str]:
    return sorted(path.read_text().split()) if path.exists() else []


def counted(path: Path, n: int) -> bool:
    return len(execution_ids(path)) >= n


def settled_count(path: Path, at_least: int, quiet: float = 2.0) -> int:
    """How many ids ``path`` holds once it has at least ``at_least`` and has not grown for ``quiet`` s."""
    last, since = -1, time.monotonic()

    def steady() -> bool:
        nonlocal last, since
        n = len(execution_ids(path))
        if n != last:
            last, since = n, time.monotonic()
        return n >= at_least and time.monotonic() - since >= quiet

    wait_until(steady, what=f"at least {at_least} in {path.name}, steady")
    return last


@pytest.mark.timeout(180)
def test_a_thousand_simultaneous_disconnects_cancel_a_thousand_tools(base: str, stack: Stack) -> None:
    started, cancelled = stack.tmp / f"hold-start-{TAG}", stack.tmp / f"hold-cancelled-{TAG}"
    calls: list[socket.socket] = []
    try:
        # Opened a hundred at a time: a thousand submits at once would exceed what one API
        # process admits per second through its Redis pool (some would get STORE_UNAVAILABLE).
        # On a machine busy enough, a few submits of a batch can still be refused (503, never
        # started); the promise under test is about the calls whose tools run.
        for opened in range(BATCH, CALLS + 1, BATCH):
            calls += [open_call(base, sse=i % 2 == 0) for i in range(BATCH)]
            running = settled_count(started, int(opened * MOST))
    finally:
        for sock in calls:
            reset(sock)
    # The tools would run for 250 s more: each one that ends now was cancelled by its caller's reset.
    wait_until(functools.partial(counted, cancelled, running), timeout=60, what=f"{running} tools cancelled")
    assert execution_ids(cancelled) == execution_ids(started)
    assert len(execution_ids(started)) >= CALLS * MOST
