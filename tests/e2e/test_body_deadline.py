"""The body deadline of ``python -m api`` over real sockets: a body that does not arrive whole
within CARMY_BODY_TIMEOUT of its headers gets 408 and the connection closed, and leaves nothing
behind (no execution, no admission slot), whether it stalls, lies about its length, is chunked
or is dripped a byte at a time."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
import redis

from carmy_worker.store import keys
from tests.raw import authority, connect, read_whole_response, until_closed
from tests.support import Proc, Stack, wait_until

TIMEOUT = 1.0  # CARMY_BODY_TIMEOUT of the server under test
ENVELOPE = json.dumps({"tool": "noop", "arguments": {}}).encode()
EXECUTION = "/agent/executions/exec_0b9d7c1e-5f3a-4e2b-9c41-7d2a8e6f1b30"


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[tuple[Proc, str]]:
    stack.worker()
    proc, url = stack.api({"CARMY_BODY_TIMEOUT": str(TIMEOUT)})
    wait_until(lambda: "noop" in httpx.get(url + "/agent/tools").text)
    yield proc, url


@pytest.fixture(scope="module")
def base(api: tuple[Proc, str]) -> str:
    return api[1]


def request_lines(proc: Proc) -> list[dict[str, object]]:
    """The API's request log (JSON lines, the default format)."""
    lines = (json.loads(line) for line in proc.output().splitlines() if line.startswith("{"))
    return [line for line in lines if line.get("event") == "request"]


def head(base: str, method: str, path: str, *framing: bytes) -> bytes:
    lines = [b"%s %s HTTP/1.1" % (method.encode(), path.encode()), b"Host: " + authority(base).encode(),
             b"Content-Type: application/json", *framing]
    if path == "/mcp":
        lines.append(b"Accept: application/json, text/event-stream")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def executions(r: redis.Redis) -> set[bytes]:
    return set(r.keys("carmy:*:exe:*"))


def assert_nothing_recorded(r: redis.Redis, before: set[bytes]) -> None:
    assert executions(r) == before  # no execution was created
    assert sum(r.zcard(keys.pending(p)) for p in keys.partitions()) == 0  # and no admission slot is held


def assert_refused_in_time(elapsed: float, received: bytes) -> None:
    assert 0.8 * TIMEOUT <= elapsed <= 3 * TIMEOUT
    assert received.startswith(b"HTTP/1.1 408 ")
    head_part, _, body = received.partition(b"\r\n\r\n")
    assert b"\r\nconnection: close" in head_part
    assert json.loads(body)["error"]["code"] == "BODY_TIMEOUT"


# Each way of not finishing a body: (what is sent at once, what is then dripped, if anything).
STALLS = {
    # Announces 100 bytes, sends 10, then nothing.
    "stalled": (b"Content-Length: 100", ENVELOPE[:10], b""),
    # A complete envelope, announced as longer than it is: the server waits for the rest.
    "lying length": (b"Content-Length: %d" % (len(ENVELOPE) + 10), ENVELOPE, b""),
    # One chunk of a chunked body, and never the last chunk.
    "chunked": (b"Transfer-Encoding: chunked", b"%x\r\n%s\r\n" % (10, ENVELOPE[:10]), b""),
    # A byte every 0.2 s: activity does not push the deadline back.
    "dripped": (b"Content-Length: 1000", b"{", b" "),
}


@pytest.mark.parametrize("stall", list(STALLS))
def test_an_unfinished_body_gets_408_and_records_nothing(base: str, sync_redis: redis.Redis, stall: str) -> None:
    framing, sent, drip = STALLS[stall]
    before = executions(sync_redis)
    with connect(base) as sock:
        sock.sendall(head(base, "POST", "/agent/execute", framing) + sent)
        elapsed, received = until_closed(sock, drip=drip)
    assert_refused_in_time(elapsed, received)
    assert_nothing_recorded(sync_redis, before)
    # The server is unharmed, and a whole body is served as usual.
    r = httpx.post(base + "/agent/execute", json={"tool": "noop", "arguments": {}})
    assert r.json()["status"] == "completed"


def test_the_request_log_says_408_body_timeout_not_a_client_that_left(api: tuple[Proc, str]) -> None:
    proc, base = api
    logged = len(request_lines(proc))
    with connect(base) as sock:
        sock.sendall(head(base, "POST", "/agent/execute", b"Content-Length: 100") + ENVELOPE[:10])
        _, received = until_closed(sock)
    assert received.startswith(b"HTTP/1.1 408 ")
    # The line of an earlier test's last request may be written after ``logged`` was counted (the
    # API writes its request lines together, up to 20 ms late): this request's is its 408.
    line = wait_until(lambda: [line for line in request_lines(proc)[logged:] if line["status_code"] in (408, 499)],
                      what="the request logged")[0]  # type: ignore[index]
    assert (line["outcome"], line["status_code"], line["error_code"]) == ("invalid", 408, "BODY_TIMEOUT")


def test_mcp_bodies_are_under_the_same_deadline(base: str, sync_redis: redis.Redis) -> None:
    before = executions(sync_redis)
    with connect(base) as sock:
        sock.sendall(head(base, "POST", "/mcp", b"Content-Length: 100") + b'{"jsonrpc":')
        elapsed, received = until_closed(sock)
    assert_refused_in_time(elapsed, received)
    assert_nothing_recorded(sync_redis, before)


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_a_body_nobody_reads_does_not_keep_the_connection(base: str, method: str) -> None:
    # The lookup routes answer without reading a body; the rest of it may never come, and the
    # connection is not kept waiting for it (the header deadline would take 15 s).
    with connect(base) as sock:
        sock.sendall(head(base, method, EXECUTION, b"Content-Length: 100") + b"{")
        answer, _ = read_whole_response(sock)
        elapsed, _ = until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 404 ")
    assert elapsed <= 3 * TIMEOUT


def test_the_deadline_is_on_the_body_not_on_the_answer(base: str) -> None:
    # A body sent in pieces but in time, for a call that runs past the deadline: it is answered.
    envelope = json.dumps({"tool": "linger", "arguments": {"seconds": 1.5 * TIMEOUT}}).encode()
    with connect(base) as sock:
        sock.sendall(head(base, "POST", "/agent/execute", b"Content-Length: %d" % len(envelope)))
        for i in range(0, len(envelope), 8):
            sock.sendall(envelope[i:i + 8])
        answer, body = read_whole_response(sock)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert json.loads(body)["status"] == "completed"
