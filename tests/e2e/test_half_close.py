"""A client that sends a whole request and then shuts down its sending side (nc -N, socat, TCP
tunnels) is answered, and its execution is not cancelled; one that closes its connection is
still a disconnect (tests/e2e/test_cancellation.py)."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.raw import authority, connect, until_closed
from tests.support import Stack, wait_until

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@pytest.fixture(scope="module")
def base(stack: Stack) -> Iterator[str]:
    stack.worker()
    _, url = stack.api()
    wait_until(lambda: "linger" in httpx.get(url + "/agent/tools").text)
    yield url


def half_closed(base: str, method: str, path: str, body: bytes = b"") -> bytes:
    """Everything the server sends to a client that shuts down its sending side right after a
    request, until the server closes the connection."""
    with connect(base) as sock:
        # Corked, the end of the request and the FIN leave in one segment: the server sees the
        # end of input before it can answer, as it would from a client farther away.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        sock.sendall(b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (method.encode(), path.encode(), authority(base).encode(), len(body), body))
        sock.shutdown(socket.SHUT_WR)
        _, received = until_closed(sock, limit=10)
    return received


def final(received: bytes) -> tuple[bytes, dict[str, object]]:
    """The status line and JSON body of the final response, after the interim one if any."""
    head, _, body = received.removeprefix(CONTINUE).partition(b"\r\n\r\n")
    assert b"\r\nconnection: close" in head  # nothing more can come on this connection
    return head.split(b"\r\n")[0], json.loads(body)


def test_a_half_closed_call_is_answered_and_runs_to_the_end(base: str) -> None:
    request = {"tool": "linger", "arguments": {"seconds": 0.5}, "request_id": str(uuid.uuid4())}
    received = half_closed(base, "POST", "/agent/execute", json.dumps(request).encode())
    assert received.startswith(CONTINUE)  # the server checked that the client was still there
    status, result = final(received)
    assert status == b"HTTP/1.1 200 OK"
    assert result["status"] == "completed"
    # What was recorded is the tool's result, not a cancellation: a retry replays it.
    assert httpx.post(base + "/agent/execute", json=request).json() == result


def test_a_half_closed_lookup_is_answered(base: str) -> None:
    accepted = httpx.post(base + "/agent/execute", json={"tool": "noop"}, headers={"prefer": "respond-async"})
    location = accepted.headers["location"]
    wait_until(lambda: httpx.get(base + location).status_code == 200)
    status, result = final(half_closed(base, "GET", location))
    assert status == b"HTTP/1.1 200 OK"
    assert result["status"] == "completed"
