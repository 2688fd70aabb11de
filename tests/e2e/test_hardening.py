"""HTTP hardening of ``python -m api`` over real sockets: header deadline and size limit,
no server banner, optional security headers and CORS."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.raw import connect, read_response, until_closed
from tests.sse import parse
from tests.support import Stack, wait_until

TIMEOUT = 1.0  # CARMY_HEADER_TIMEOUT of the hardened server
LIMIT = 65536  # the default max_header_bytes
ORIGIN = "https://app.example"
SECURITY_HEADERS = {
    "x-content-type-options": "nosniff",
    "content-security-policy": "default-src 'none'; frame-ancestors 'none'",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cross-origin-resource-policy": "same-origin",
}
REQUEST = b"GET /.well-known/agent HTTP/1.1\r\nHost: localhost\r\n\r\n"


@pytest.fixture(scope="module")
def plain(stack: Stack) -> str:
    """A server with the default settings."""
    return stack.api()[1]


@pytest.fixture(scope="module")
def hardened(stack: Stack) -> Iterator[str]:
    """A server with a 1 s header deadline, security headers and CORS for two origins."""
    stack.worker()
    _, base = stack.api({"CARMY_HEADER_TIMEOUT": str(TIMEOUT), "CARMY_SECURITY_HEADERS": "1",
                         "CARMY_CORS_ORIGINS": f"{ORIGIN}, https://other.example/"})
    wait_until(lambda: httpx.get(base + "/agent/tools").json()["tools"])
    yield base


# Header deadline: whatever a client sends, headers not complete in time close the connection.

def test_a_connection_that_sends_nothing_is_closed(hardened: str) -> None:
    with connect(hardened) as sock:
        elapsed, received = until_closed(sock)
    assert 0.8 <= elapsed <= 3 * TIMEOUT
    assert received == b""  # nothing was asked: nothing to answer


DRIP_START = b"GET /.well-known/agent HTTP/1.1\r\nHost: localhost\r\nX-Drip: "


def test_dripping_headers_does_not_keep_a_connection_open(hardened: str) -> None:
    with connect(hardened) as sock:
        sock.sendall(DRIP_START)
        elapsed, received = until_closed(sock, drip=b"a")
    assert 0.8 <= elapsed <= 3 * TIMEOUT
    assert received.startswith(b"HTTP/1.1 408 ")  # a request had begun: it is told why


@pytest.mark.parametrize("drip", [False, True], ids=["idle", "dripping"])
def test_keep_alive_connection_is_closed_after_the_deadline(hardened: str, drip: bool) -> None:
    # uvicorn's own keep-alive timer (5 s) is restarted by every byte received.
    with connect(hardened) as sock:
        sock.sendall(REQUEST)
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        if drip:
            sock.sendall(DRIP_START)
        elapsed, _ = until_closed(sock, drip=b"a" if drip else b"")
    assert 0.8 <= elapsed <= 3 * TIMEOUT


def test_a_slow_sse_stream_is_not_cut_by_the_header_deadline(hardened: str) -> None:
    body = {"tool": "linger", "arguments": {"seconds": 2 * TIMEOUT}}
    r = httpx.post(hardened + "/agent/execute", json=body, headers={"accept": "text/event-stream"}, timeout=10)
    assert parse(r.text)[-1][1]["status"] == "completed"


# Header size: the limit holds, and nothing beyond it is buffered.

def test_headers_just_under_the_limit_are_served(plain: str) -> None:
    r = httpx.get(plain + "/.well-known/agent", headers={"x-pad": "a" * (LIMIT - 1024)})
    assert r.status_code == 200


def test_complete_headers_over_the_limit_get_431(plain: str) -> None:
    r = httpx.get(plain + "/.well-known/agent", headers={"x-pad": "a" * (LIMIT + 1024)})
    assert r.status_code == 431
    assert r.headers["connection"] == "close"


def test_an_unterminated_header_over_the_limit_gets_431_at_once(plain: str) -> None:
    with connect(plain) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"a" * (LIMIT + 1024))
        elapsed, received = until_closed(sock)
    assert elapsed < 2  # not the 15 s header deadline
    assert received.startswith(b"HTTP/1.1 431 ")
    assert b"\r\nserver:" not in received.lower()


def test_a_megabyte_header_is_refused_and_the_server_stays_healthy(plain: str) -> None:
    start = time.monotonic()
    with connect(plain) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Pad: ")
        try:
            for _ in range(64):
                sock.sendall(b"a" * 16384)
        except (ConnectionResetError, BrokenPipeError):
            pass  # refused while we were still sending
        _, received = until_closed(sock)
    assert time.monotonic() - start < 5
    # 431, unless the reset of a close with unread data overtook it.
    assert received == b"" or received.startswith(b"HTTP/1.1 431 ")
    assert httpx.get(plain + "/.well-known/agent").status_code == 200


# Response headers.

def test_no_server_header(plain: str, hardened: str) -> None:
    for base in (plain, hardened):
        r = httpx.get(base + "/.well-known/agent")
        assert "server" not in r.headers
        assert "date" in r.headers


def test_security_headers_are_off_by_default(plain: str) -> None:
    r = httpx.get(plain + "/.well-known/agent")
    assert not SECURITY_HEADERS.keys() & r.headers.keys()


def test_security_headers_on_documents_and_streams(hardened: str) -> None:
    r = httpx.get(hardened + "/.well-known/agent")
    assert {name: r.headers.get(name) for name in SECURITY_HEADERS} == SECURITY_HEADERS
    body = {"tool": "noop", "arguments": {}}
    with httpx.stream("POST", hardened + "/agent/execute", json=body,
                      headers={"accept": "text/event-stream"}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        assert {name: r.headers.get(name) for name in SECURITY_HEADERS} == SECURITY_HEADERS
        events = parse(r.read().decode())
    assert events[-1][0] == "execution.completed"


def preflight(base: str, origin: str) -> httpx.Response:
    return httpx.options(base + "/agent/execute", headers={
        "origin": origin, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})


def test_cors_is_off_by_default(plain: str) -> None:
    r = preflight(plain, ORIGIN)
    assert r.status_code == 403  # no origin but the server's own is allowed (api/guards/browser.py)
    assert not [name for name in r.headers if name.startswith("access-control-")]
    r = httpx.get(plain + "/.well-known/agent", headers={"origin": ORIGIN})
    assert "access-control-allow-origin" not in r.headers


def test_cors_preflight_allows_only_configured_origins(hardened: str) -> None:
    for origin in (ORIGIN, "https://other.example"):  # the second was configured with a "/"
        r = preflight(hardened, origin)
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == origin
        assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE"
        assert {"authorization", "content-type"} <= set(r.headers["access-control-allow-headers"].lower().split(", "))
        assert "access-control-allow-credentials" not in r.headers
        assert r.headers["x-content-type-options"] == "nosniff"  # preflights carry security headers too
    r = preflight(hardened, "https://evil.example")
    assert r.status_code == 400
    assert "access-control-allow-origin" not in r.headers


def test_cors_response_exposes_the_headers_agents_read(hardened: str) -> None:
    r = httpx.get(hardened + "/.well-known/agent", headers={"origin": ORIGIN})
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert r.headers["access-control-expose-headers"] == "ETag, Retry-After, Location"
    r = httpx.get(hardened + "/.well-known/agent", headers={"origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers
