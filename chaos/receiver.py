"""The callback receiver: an HTTP server on 127.0.0.1, in the chaos process, that the jobs asking
for a callback name in ``notify``. It verifies every delivery with the ``standardwebhooks``
library (``CARMY_NOTIFY_SECRET``), records it (``Callback``), and while ``failing`` answers 500
to a share of them, and answers another share only after the worker has given up on it (past
its 10 s timeout: a receiver that hangs), so that callbacks are retried; otherwise 204.
"""

from __future__ import annotations

import base64
import json
import os
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook, WebhookVerificationError

from carmy_worker.jobs import outbound
from chaos.model import Callback

FAIL_SHARE = 0.20  # of the deliveries, while the load runs
HANG_SHARE = 0.05  # of the others, while the load runs
HANG_S = outbound.TIMEOUT_S + 2.0  # how long a hanging answer holds the worker's delivery: past its timeout
HUNG = 0  # the status recorded for a delivery answered only once the worker had given up


class Receiver:
    """``start`` it, give jobs its ``url``; ``callbacks`` is every delivery it got."""

    def __init__(self, seed: int) -> None:
        self.secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
        self.callbacks: list[Callback] = []
        self.failing = True  # set to False when the faults stop: the end waits for no backoff
        self._rng = random.Random(seed * 31337)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="receiver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/callback"

    def env(self) -> dict[str, str]:
        """For APIs and workers: callbacks on, to this receiver only."""
        return {"CARMY_NOTIFY_SECRET": self.secret, "CARMY_NOTIFY_HOSTS": "127.0.0.1",
                "CARMY_NOTIFY_ALLOW_PRIVATE": "true"}

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def record(self, body: bytes, headers: dict[str, str]) -> int:
        """Verifies and records one delivery; the status to answer."""
        try:
            Webhook(self.secret).verify(body, headers)
            verified = True
        except WebhookVerificationError:
            verified = False
        try:
            doc = json.loads(body)
        except ValueError:
            doc = {}
        doc = doc if isinstance(doc, dict) else {}
        with self._lock:
            draw = self._rng.random()
            status = 204 if not self.failing else 500 if draw < FAIL_SHARE \
                else HUNG if draw < FAIL_SHARE + HANG_SHARE else 204
            self.callbacks.append(Callback(
                t=time.time(), webhook_id=headers.get("webhook-id", ""), verified=verified,
                job_id=doc.get("job_id"), status=doc.get("status"), attempts=doc.get("attempts") or 0,
                answered=status))
        return status

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = receiver.record(body, {k.lower(): v for k, v in self.headers.items()})
                if status == HUNG:
                    time.sleep(HANG_S)  # the worker gave up meanwhile: its next attempt is another delivery
                    self.close_connection = True
                    return
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass  # one line per delivery on stderr would bury the run's progress

        return Handler
