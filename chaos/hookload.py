"""Webhook deliveries of the load: a share of the clients' turns (``--hooks``) is a sender
delivering one event to one of the two webhooks the chaos APIs declare (``CARMY_WEBHOOKS``,
``config``): ``chaos-call`` (HMAC-SHA256 in ``X-Hub-Signature-256``, event id ``/id`` in the body,
mode ``call``, tool ``hook_charge``) and ``chaos-job`` (Standard Webhooks, event id the
``webhook-id`` header, mode ``job``, tool ``hook_job``).

A sender does as GitHub's or Svix's do: the same event again (same event id and body, a fresh
signature) after a transport error, a 5xx or a timeout, until it has its answer; then, some of the
time, once more (a redelivery). A forged event (a body changed after signing, no signature, or
the wrong secret) is sent until it has an HTTP answer, and never signed right. At the end, every
true event is delivered once more (``finish``): the replay is the reconciliation's last word.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import itertools
import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import httpx
from standardwebhooks import Webhook as StandardSigner

from chaos.calls import REFUSAL_CODES, RETRY_CODES, answer_of, code_of
from chaos.load import new_client
from chaos.model import Delivery, Event, marked

SHARE = 0.08  # of the clients' turns, by default
FORGED = 0.15  # of the events
REDELIVERED = 0.3  # of the true events: delivered once more after their answer
FORGERIES = ("tampered", "unsigned", "wrong-secret")
WORK_MS = (20, 400)
TIMEOUT = httpx.Timeout(30.0, connect=2.0)  # a call's answer waits for its tool
HMAC_ENV, STANDARD_ENV = "CHAOS_HOOK_HMAC_SECRET", "CHAOS_HOOK_STANDARD_SECRET"


class Secrets:
    """The two webhooks' secrets, fresh for each run, and the environment that declares them."""

    def __init__(self) -> None:
        self.hmac = os.urandom(16).hex()
        self.standard = "whsec_" + base64.b64encode(os.urandom(24)).decode()

    def env(self) -> dict[str, str]:
        return {"CARMY_WEBHOOKS": json.dumps(config()), HMAC_ENV: self.hmac, STANDARD_ENV: self.standard}


def config() -> dict[str, Any]:
    """``CARMY_WEBHOOKS``: the secrets named, never inlined."""
    return {
        "chaos-call": {"tool": "hook_charge", "mode": "call", "event_id": "/id", "arguments": "/args",
                       "verify": {"scheme": "hmac-sha256", "header": "X-Hub-Signature-256", "secret_env": HMAC_ENV}},
        "chaos-job": {"tool": "hook_job", "mode": "job", "event_id": "webhook-id",
                      "verify": {"scheme": "standard-webhooks", "secret_env": STANDARD_ENV}},
    }


def new_event(rng: random.Random, eid: str) -> Event:
    mode: Literal["call", "job"] = rng.choice(["call", "job"])
    ms = rng.randint(*WORK_MS)
    forged = rng.choice(FORGERIES) if rng.random() < FORGED else None
    body: dict[str, Any] = {"id": eid, "args": marked({"ms": ms})} if mode == "call" else marked({"ms": ms})
    return Event(eid=eid, hook=f"chaos-{mode}", mode=mode, body=body, forged=forged, first=time.time())


def signed(event: Event, secrets: Secrets) -> tuple[bytes, dict[str, str]]:
    """The raw body and headers of one delivery of ``event``: signed now, or forged as it says."""
    raw = json.dumps(event.body, separators=(",", ":"))
    sent = raw
    if event.forged == "tampered":  # signed, then changed on the way
        sent = raw.replace('"ms":', '"ms":1', 1)
    if event.mode == "call":
        key = secrets.hmac if event.forged != "wrong-secret" else os.urandom(16).hex()
        headers = {"X-Hub-Signature-256": "sha256=" + hmac.new(key.encode(), raw.encode(), hashlib.sha256).hexdigest()}
    else:
        secret = secrets.standard if event.forged != "wrong-secret" else Secrets().standard
        now = datetime.datetime.now(tz=datetime.UTC)
        headers = {"webhook-id": event.eid, "webhook-timestamp": str(int(now.timestamp())),
                   "webhook-signature": StandardSigner(secret).sign(event.eid, now, raw)}
    if event.forged == "unsigned":
        headers.pop("X-Hub-Signature-256", None)
        headers.pop("webhook-signature", None)
    return sent.encode(), headers | {"Content-Type": "application/json"}


def deliver(client: httpx.Client, base: str, event: Event, secrets: Secrets,
            phase: Literal["load", "final"]) -> Delivery:
    """One ``POST /agent/webhooks/{name}``."""
    result = Delivery(t0=time.time(), t1=0.0, api=base, phase=phase)
    body, headers = signed(event, secrets)
    try:
        r = client.post(f"{base}/agent/webhooks/{event.hook}", content=body, headers=headers, timeout=TIMEOUT)
        result.http = r.status_code
        doc = r.json()
        result.code = code_of(doc)
        if event.mode == "job" and r.status_code in (200, 202) and isinstance(doc, dict):
            result.job_id = doc.get("job_id")
        elif event.mode == "call" and (answer := answer_of(doc)) is not None:
            result.execution_id, result.code, result.final = answer.execution_id, answer.code, True
    except (httpx.HTTPError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    result.t1 = time.time()
    return result


def answered(event: Event, delivery: Delivery) -> bool:
    """Whether a sender stops here: an answer, or (for a forged event) any HTTP answer."""
    if event.forged is not None:
        return delivery.http is not None and delivery.code not in RETRY_CODES
    return delivery.final or delivery.job_id is not None or delivery.code in REFUSAL_CODES


def send(client: httpx.Client, bases: list[str], event: Event, secrets: Secrets, base: str, deadline: float,
         phase: Literal["load", "final"] = "load") -> None:
    """Delivers ``event`` until it is answered or ``deadline`` (wall clock), moving to the other API
    after a transport error or a 5xx."""
    backoff = 0.1
    while time.time() < deadline:
        delivery = deliver(client, base, event, secrets, phase)
        event.deliveries.append(delivery)
        if answered(event, delivery):
            return
        if delivery.error is not None or (delivery.http or 0) >= 500:
            base = bases[(bases.index(base) + 1) % len(bases)]
        time.sleep(min(backoff * random.uniform(0.5, 1.5), max(0.0, deadline - time.time())))
        backoff = min(backoff * 2, 2.0)


class HookLoad:
    """The events the clients send (``deliver``) and the end (``finish``)."""

    def __init__(self, bases: list[str], patience: float, run_id: str, secrets: Secrets,
                 share: float = SHARE) -> None:
        self.bases = bases
        self.patience = patience
        self.run_id = run_id
        self.secrets = secrets
        self.share = share
        self.events: list[Event] = []
        self.client = new_client()
        self._ids = itertools.count()
        self._ids_lock = threading.Lock()

    def deliver(self, rng: random.Random, base: str) -> None:
        """One event, from a client's thread: sent until answered, then perhaps once more."""
        with self._ids_lock:
            n = next(self._ids)
        event = new_event(rng, f"{self.run_id}-h{n}")
        self.events.append(event)  # list.append is atomic under the GIL
        send(self.client, self.bases, event, self.secrets, base, event.first + self.patience)
        if event.forged is None and rng.random() < REDELIVERED:
            send(self.client, self.bases, event, self.secrets, base, time.time() + self.patience)

    def finish(self, each: float) -> None:
        """Every true event delivered once more, once the faults have stopped (``each`` s at most)."""
        def one(i: int, event: Event) -> None:
            send(self.client, self.bases, event, self.secrets, self.bases[i % len(self.bases)],
                 time.time() + each, "final")

        true = [event for event in self.events if event.forged is None]
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(one, range(len(true)), true))
