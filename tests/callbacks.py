"""A callback receiver for the tests: a real HTTP server on 127.0.0.1, in a thread, that records
every request (path, headers, body) and answers each path with the statuses it is given, in turn
(then 200); a 3xx also names ``/redirected`` in its Location."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
NOTIFY_ENV = {"CARMY_NOTIFY_SECRET": SECRET, "CARMY_NOTIFY_HOSTS": "127.0.0.1", "CARMY_NOTIFY_ALLOW_PRIVATE": "true"}


@dataclass
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    port: int = 0
    deliveries: list[Delivery] = field(default_factory=list)
    answers: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def to(self, path: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.path == path]

    def answer(self, path: str, *statuses: int) -> None:
        with self.lock:
            self.answers[path] = list(statuses)


@contextmanager
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            with state.lock:
                state.deliveries.append(Delivery(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                queued = state.answers.get(self.path) or []
                status = queued.pop(0) if queued else 200
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("location", f"/redirected{self.path}")
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
