"""HTTP/1.1 over a bare socket, for tests of what a client can do that httpx never would:
stall, drip, lie about a length, half-close."""

from __future__ import annotations

import select
import socket
import time

DRIP_EVERY = 0.2  # seconds between two dripped bytes


def connect(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def authority(base: str) -> str:
    """The ``Host`` a client of ``base`` sends, such as ``127.0.0.1:8000``."""
    return base.removeprefix("http://")


def read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length, read whole; its head is returned."""
    return read_whole_response(sock)[0]


def read_whole_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """One response with a Content-Length, read whole: ``(head, body)``. Interim (1xx)
    responses before it are skipped."""
    data = b""
    while True:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"closed before a whole response: {data!r}"
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 1"):
            break
    length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                  if line.startswith(b"content-length:"))
    while len(data) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole body: {head!r} {data!r}"
        data += chunk
    return head, data[:length]


def until_closed(sock: socket.socket, drip: bytes = b"", limit: float = 5.0) -> tuple[float, bytes]:
    """Seconds until the server closes the connection and what it sent meanwhile, while sending
    ``drip`` (if any) one byte every ``DRIP_EVERY`` seconds."""
    start = time.monotonic()
    received = b""
    while time.monotonic() - start < limit:
        readable, _, _ = select.select([sock], [], [], DRIP_EVERY)
        try:
            if not readable:
                if drip:
                    sock.sendall(drip)
                continue
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            chunk = b""
        if not chunk:
            return time.monotonic() - start, received
        received += chunk
    raise AssertionError(f"the connection is still open after {limit} s")
