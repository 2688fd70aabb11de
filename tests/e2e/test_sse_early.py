"""A streamed call without a ``request_id`` names its execution as soon as its SUBMIT has left for
Redis (docs/protocol.md, section 5): ``execution.started`` does not wait for Redis's reply, and
whatever the stream says after it is about that execution."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import httpx

from bench.latency import sse_request
from tests.conftest import private_stack
from tests.e2e.test_faults import ready
from tests.sse import parse
from tests.support import Stack, wait_until

_END = b"\r\n0\r\n\r\n"  # the last chunk of a chunked body


def open_stream(base: str, body: dict[str, object]) -> socket.socket:
    url = urlsplit(base)
    sock = socket.create_connection((url.hostname or "127.0.0.1", url.port or 80), timeout=60)
    sock.sendall(sse_request(url.netloc, body))
    return sock


def read_until(sock: socket.socket, marker: bytes, got: bytes = b"") -> bytes:
    """What ``sock`` sent, read until ``marker`` is in it (the socket's timeout bounds each read)."""
    while marker not in got:
        chunk = sock.recv(65536)
        assert chunk, f"the stream ended early: {got[-300:]!r}"
        got += chunk
    return got


def events_of(raw: bytes) -> list[tuple[str, dict[str, object]]]:
    """The events of a chunked SSE answer read whole."""
    _, _, body = raw.partition(b"\r\n\r\n")
    text, rest = b"", body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        text, rest = text + rest[:size], rest[size + 2:]
    return parse(text.decode())


def first_event_id(sock: socket.socket) -> tuple[str, bytes]:
    got = read_until(sock, b"\n\n", read_until(sock, b"event: execution.started"))
    data = got.split(b"event: execution.started\ndata: ", 1)[1].split(b"\n", 1)[0]
    return str(json.loads(data)["execution_id"]), got


def test_each_execution_named_by_a_first_event_is_found_at_once(fresh_stack: Stack) -> None:
    """Told its id, a client that asks about the execution at once finds it: SUBMIT was written
    to Redis before the frame, and Redis reads it first. (A call SUBMIT refused, which a busy
    machine can bring about, NO_WORKERS say, names an execution nothing recorded: its stream
    says so.)"""
    fresh_stack.worker()
    _, base = fresh_stack.api()
    wait_until(lambda: '"noop"' in httpx.get(base + "/agent/tools").text)
    accepted = 0
    with httpx.Client(base_url=base, timeout=30) as client:
        for i in range(40):
            with open_stream(base, {"tool": "noop", "arguments": {}}) as sock:
                exec_id, got = first_event_id(sock)
                found = client.get(f"/agent/executions/{exec_id}")
                events = events_of(read_until(sock, _END, got))
            assert {data["execution_id"] for _, data in events} == {exec_id}
            final = events[-1][1]
            if "error" in final and [name for name, _ in events] == ["execution.started", "execution.completed"]:
                assert found.status_code == 404, (i, found.text, events)  # refused: nothing recorded
                continue
            assert found.status_code in (200, 202), (i, exec_id, found.text, events)  # done, or still going
            assert [name for name, _ in events] == ["execution.started", "tool.started", "tool.completed",
                                                    "execution.completed"]
            accepted += 1
    assert accepted >= 20


def test_a_stream_whose_submit_goes_unanswered_ends_for_the_execution_it_named() -> None:
    """Redis stops after the SUBMIT was written: the stream has named its execution already, and
    ends with ``STORE_UNAVAILABLE`` for that id once the API stops waiting (1 s). The SUBMIT was
    in Redis's socket: once Redis runs again it creates that execution, which the worker runs,
    and a client that asks about the id it was given finds the outcome. (Before, the stream
    named a fresh id that nothing ever recorded, and the execution that did run had an id
    nobody was told.)"""
    with private_stack() as (server, stack):
        _, base = ready(stack, "noop")
        for _ in range(2):  # warm: Redis has run SUBMIT on the API's connection (the first loads it)
            with open_stream(base, {"tool": "noop", "arguments": {}}) as sock:
                read_until(sock, _END)
        server.pause()
        try:
            with open_stream(base, {"tool": "noop", "arguments": {}}) as sock:
                events = events_of(read_until(sock, _END))
        finally:
            server.resume()
        assert [name for name, _ in events] == ["execution.started", "execution.completed"]
        exec_id = events[0][1]["execution_id"]
        final = events[1][1]
        assert final["execution_id"] == exec_id
        assert final["status"] == "failed"
        assert final["error"]["code"] == "STORE_UNAVAILABLE"  # type: ignore[index]
        with httpx.Client(base_url=base, timeout=30) as client:
            def outcome() -> dict[str, object] | None:
                r = client.get(f"/agent/executions/{exec_id}")
                assert r.status_code in (200, 202, 503), r.text  # never 404: the execution was created
                body = r.json()
                return body if r.status_code == 200 and body.get("status") == "completed" else None
            wait_until(lambda: outcome() is not None, what="the named execution's outcome")


def test_a_call_refused_by_submit_ends_the_stream_it_began_with_the_same_id(fresh_stack: Stack) -> None:
    """Refused by SUBMIT itself (no live worker serves the tool any more), after the stream named
    the execution: ``execution.completed`` with the refusal, for that id, which was never
    recorded."""
    worker = fresh_stack.worker()
    _, base = fresh_stack.api()
    wait_until(lambda: '"noop"' in httpx.get(base + "/agent/tools").text)
    worker.kill()
    with httpx.Client(base_url=base, timeout=30) as client:
        # As the API's admission counts them (tests/e2e/test_capacity.py says how long that takes).
        wait_until(lambda: client.get("/ready").json()["checks"]["workers"]["live"] == 0, 15)
        with open_stream(base, {"tool": "noop", "arguments": {}}) as sock:
            events = events_of(read_until(sock, _END))
        assert [name for name, _ in events] == ["execution.started", "execution.completed"]
        exec_id = events[0][1]["execution_id"]
        assert events[1][1]["execution_id"] == exec_id
        assert events[1][1]["error"]["code"] == "NO_WORKERS"  # type: ignore[index]
        assert client.get(f"/agent/executions/{exec_id}").status_code == 404
