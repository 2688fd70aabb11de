"""Imported tools: an HTTP API served as tools from its OpenAPI document (README, "Serve an
existing API"), under the same faults. The upstream is an HTTP server on 127.0.0.1 in the chaos
process, out of the faults' reach: it serves its document (one operation, ``POST /orders``,
``place_order``: not idempotent, as every ``POST``), and counts every order it is sent, by its
``Idempotency-Key``, the moment the request arrives (its effect), then works 0-300 ms (the
``ms`` query parameter) and answers ``201`` with the order's number. It does not honour the
key: a second request with one is a second order, so the check sees what Carmy sent.

A share of the clients' turns (``--imported``) calls ``place_order`` with a fresh request id,
retried with the same one as any call (``chaos.load.retry_call``), and once more at the end.
With no principal, the key the worker sends is the request id.

Definitions (each a violation):

* **sent twice**: a request id whose order the upstream got twice or more. The tool is not
  idempotent: a request goes out at most once (an attempt cut off by a fault is answered
  ``EXECUTION_UNCERTAIN``, never sent again), and a retry joins or replays.
* **sent unasked**: an order under a key that is no request id of the load.
* **completed, not sent**: an answer ``completed`` whose request id the upstream never got, or
  whose ``order`` is not the upstream's number for that key.
* **flipped**: two final answers of one request that differ.

Counted as info: requests, answered and how, sent; of the answers ``EXECUTION_UNCERTAIN`` or an
``UPSTREAM_*`` error, those whose order the upstream got (an honest "may have happened").
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
from msgspec import Struct

from chaos.load import pick_mode, retry_call
from chaos.model import Request

SHARE = 0.05  # of the clients' turns, by default
TOOL = "place_order"
WORK_MS = (0, 300)
DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0", "info": {"title": "chaos orders", "version": "1"},
    "paths": {"/orders": {"post": {
        "operationId": TOOL, "summary": "Place an order (not idempotent).",
        "parameters": [{"name": "ms", "in": "query", "required": True, "schema": {"type": "integer"}},
                       # The check's marker (chaos.model.ARGUMENT_MARK), which every load's arguments carry.
                       {"name": "mark", "in": "query", "schema": {"type": "string"}}],
        "responses": {"201": {"description": "placed", "content": {"application/json": {"schema": {
            "type": "object", "properties": {"order": {"type": "integer"}, "key": {"type": "string"}}}}}}}}}},
}


class Order(Struct, frozen=True):
    """One request the upstream got: its ``Idempotency-Key``, when, and the number it gave."""

    key: str
    t: float
    order: int


class Upstream:
    """``start`` it, give the workers ``worker_args()``; ``orders`` is every request it got."""

    def __init__(self) -> None:
        self.orders: list[Order] = []
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="upstream", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def worker_args(self) -> list[str]:
        """What a worker's command line adds to serve the upstream's operation as a tool."""
        return ["--openapi", self.url + "/openapi.json", "--base-url", self.url]

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def place(self, key: str) -> int:
        """Counts an order (the effect, as it arrives); its number."""
        with self._lock:
            order = next(self._numbers)
            self.orders.append(Order(key=key, t=time.time(), order=order))
        return order

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the workers' pool keeps its connections

            def do_GET(self) -> None:
                self._send(200, DOCUMENT) if self.path == "/openapi.json" else self._send(404, {"detail": "no"})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                parts = urlsplit(self.path)
                if parts.path != "/orders":
                    self._send(404, {"detail": "no"})
                    return
                key = self.headers.get("Idempotency-Key", "")
                order = upstream.place(key)
                time.sleep(int(parse_qs(parts.query).get("ms", ["0"])[0]) / 1000)
                self._send(201, {"order": order, "key": key})

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # its worker was killed meanwhile: the order stands, unanswered
                    self.close_connection = True

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


class ImportedLoad:
    """The clients' calls of the imported tool, kept for the check."""

    def __init__(self, bases: list[str], patience: float, run_id: str, share: float = SHARE) -> None:
        self.bases = bases
        self.patience = patience
        self.run_id = run_id
        self.share = share
        self.requests: list[Request] = []
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def call(self, client: httpx.Client, rng: random.Random, base: str) -> None:
        """One call with a fresh request id, retried with it until answered (``retry_call``)."""
        with self._lock:
            n = next(self._ids)
        request = Request(rid=f"{self.run_id}-o{n}", tool=TOOL, args={"ms": rng.randint(*WORK_MS)},
                          first=time.time())
        self.requests.append(request)  # list.append is atomic under the GIL
        retry_call(client, self.bases, request, pick_mode(rng), base, request.first + self.patience)


class ImportedTable(Struct, kw_only=True):
    """The imported calls' findings. Lists hold request ids (keys, for the unasked)."""

    requests: int
    answered: dict[str, int]  # by status and code: "completed", "failed UPSTREAM_UNAVAILABLE"…
    sent: int  # orders the upstream got
    maybe_sent: int  # answers saying it may have happened (uncertain, an upstream error) that did
    sent_twice: list[str]
    unasked: list[str]
    unfounded: list[str]
    flipped: list[str]

    def violations(self) -> dict[str, int]:
        found = {"imported calls sent twice": len(self.sent_twice),
                 "imported calls sent unasked": len(self.unasked),
                 "imported calls completed, not sent": len(self.unfounded),
                 "imported calls' answers flipped": len(self.flipped)}
        return {name: n for name, n in found.items() if n}


def reconcile_imported(requests: list[Request], orders: list[Order]) -> ImportedTable:
    """The rows, from the answers the clients got and the orders the upstream counted."""
    by_key: dict[str, list[Order]] = {}
    for order in orders:
        by_key.setdefault(order.key, []).append(order)
    rids = {request.rid for request in requests}
    answered: Counter[str] = Counter()
    unfounded, flipped = [], []
    maybe_sent = 0
    for request in requests:
        answers = {a.answer for a in request.attempts if a.answer is not None}
        if len(answers) > 1:
            flipped.append(request.rid)
        if not answers:
            continue
        answer = next(iter(answers))
        answered[answer.status + (f" {answer.code}" if answer.code else "")] += 1
        got = by_key.get(request.rid, [])
        if answer.status == "completed":
            number = json.loads(answer.data or "null")
            if not got or not isinstance(number, dict) or number.get("order") not in {o.order for o in got}:
                unfounded.append(request.rid)
        elif got:
            maybe_sent += 1
    return ImportedTable(
        requests=len(requests), answered=dict(sorted(answered.items())), sent=len(orders), maybe_sent=maybe_sent,
        sent_twice=sorted(key for key, got in by_key.items() if len(got) > 1 and key in rids),
        unasked=sorted(key for key in by_key if key not in rids),
        unfounded=sorted(unfounded), flipped=sorted(flipped))
