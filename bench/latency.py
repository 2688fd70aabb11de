"""Latency of single calls made one after another: SSE time to first event and to the end of
the stream.

The client is a bare socket on one kept-alive connection, writing a request built once and
reading the chunked stream as it comes: about as little client as wrk is for the other rows, so
that the figures are the server's time and can be compared with them. (An HTTP library in
Python added about a millisecond of its own to each call on this machine.)"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

_END = b"\r\n0\r\n\r\n"  # the last chunk of a chunked body


@dataclass(frozen=True)
class Percentiles:
    count: int
    p50_ms: float
    p99_ms: float


def percentiles(samples_ms: list[float]) -> Percentiles:
    ordered = sorted(samples_ms)
    return Percentiles(count=len(ordered), p50_ms=ordered[len(ordered) // 2],
                       p99_ms=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))])


class StreamProblem(RuntimeError):
    """An SSE call did not end as a completed execution."""


def sse_request(host: str, body: dict[str, object]) -> bytes:
    """``POST /agent/execute`` asking for a stream, as bytes."""
    payload = json.dumps(body).encode()
    return (f"POST /agent/execute HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload


def sse_call(sock: socket.socket, request: bytes) -> tuple[float, float]:
    """One streamed call on a kept-alive connection: (ms to the first ``event:`` frame, ms to the
    end of the stream)."""
    start = time.perf_counter()
    sock.sendall(request)
    first: float | None = None
    text = b""
    while not text.endswith(_END):
        chunk = sock.recv(65536)
        if not chunk:
            raise StreamProblem(f"the connection closed mid-stream: {text[-300:]!r}")
        if first is None and b"event:" in text[-8:] + chunk:
            first = time.perf_counter()
        text += chunk
    end = time.perf_counter()
    head, _, stream = text.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200") or b"chunked" not in head.lower():
        raise StreamProblem(f"SSE call answered {head[:300]!r}")
    if first is None or b"event: execution.completed" not in stream or b'"status":"completed"' not in stream:
        raise StreamProblem(f"SSE stream did not complete: {stream[-300:]!r}")
    return (first - start) * 1000, (end - start) * 1000


def sse_latency(base: str, tool: str, calls: int, warmup: int = 20) -> tuple[Percentiles, Percentiles]:
    """Percentiles of time to first event and time to ``execution.completed``, over ``calls``."""
    url = urlsplit(base)
    request = sse_request(url.netloc, {"tool": tool, "arguments": {}})
    firsts, totals = [], []
    with socket.create_connection((url.hostname or "127.0.0.1", url.port or 80), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(warmup + calls):
            first, total = sse_call(sock, request)
            if i >= warmup:
                firsts.append(first)
                totals.append(total)
    return percentiles(firsts), percentiles(totals)
