"""API keys over a real socket: the key is checked before the body is read."""

from __future__ import annotations

import json
import socket

from tests.support import Stack

TOKEN = "carol-token-0123456789"


def test_unauthenticated_request_is_answered_without_reading_the_body(stack: Stack) -> None:
    keys = json.dumps({TOKEN: {"principal": "carol", "permissions": []}})
    _, base = stack.api({"CARMY_API_KEYS": keys})
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=3) as s:
        # Announce a body and never send it: reading it first would hang until the timeout.
        s.sendall(b"POST /agent/execute HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n")
        received = b""
        while b"UNAUTHENTICATED" not in received:  # head and body may come in separate segments
            chunk = s.recv(4096)
            if not chunk:
                break
            received += chunk
    assert received.startswith(b"HTTP/1.1 401")
    assert b"UNAUTHENTICATED" in received
