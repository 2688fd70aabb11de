"""One attempt of a call, in each of the three ways an agent can make it: a plain JSON POST,
an SSE stream, or ``Prefer: respond-async`` and polling. Each returns an ``Attempt`` saying
whether it got a final answer, a refusal to retry, or nothing (a transport error, a timeout)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from chaos.model import Answer, Attempt, Mode, Request, marked

# Refusals worth retrying with the same request_id: nothing was recorded, and the cause passes
# (Redis back, or with memory again, a worker back, the queue drained; a catalog Redis lost comes
# back with a beat).
RETRY_CODES = frozenset({"STORE_UNAVAILABLE", "STORE_FULL", "NO_WORKERS", "QUEUE_FULL", "TOOL_NOT_FOUND"})
# Refusals that are final for a client: nothing was recorded and retrying would not change it.
REFUSAL_CODES = frozenset({"INVALID_ID", "IDEMPOTENCY_CONFLICT", "CONFIRMATION_REQUIRED", "INVALID_REQUEST",
                           "UNSUPPORTED_MEDIA_TYPE", "PAYLOAD_TOO_LARGE", "UNAUTHENTICATED"})
POLL_S = 0.2


def answer_of(body: Any) -> Answer | None:
    """The final answer a result body carries, or None for a refusal or a 202."""
    if not isinstance(body, dict) or "execution_id" not in body or body.get("status") in ("queued", "running"):
        return None
    error = body.get("error") or {}
    code = error.get("code")
    if code in RETRY_CODES or code in REFUSAL_CODES:
        return None
    data = json.dumps(body["data"], sort_keys=True, separators=(",", ":")) if "data" in body else None
    return Answer(execution_id=body["execution_id"], status=body["status"], code=code, data=data)


def code_of(body: Any) -> str | None:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("code"))
    return None


def padded(arguments: dict[str, int]) -> dict[str, Any]:
    """``arguments`` as sent: a ``pad`` (a size, as ``chaos.load`` keeps it) made that many bytes."""
    size = arguments.get("pad")
    return arguments if size is None else arguments | {"pad": "p" * size}


def attempt(client: httpx.Client, base: str, request: Request, mode: Mode, timeout: float) -> Attempt:
    """One try of ``request`` against the API at ``base``, giving up after ``timeout`` seconds."""
    envelope = {"tool": request.tool, "arguments": marked(padded(request.args)), "request_id": request.rid}
    result = Attempt(t0=time.time(), t1=0.0, mode=mode, api=base)
    try:
        if mode == "json":
            _json(client, base, envelope, timeout, result)
        elif mode == "sse":
            _sse(client, base, envelope, timeout, result)
        else:
            _async(client, base, envelope, timeout, result)
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: a body cut short is not JSON
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    result.t1 = time.time()
    return result


def _json(client: httpx.Client, base: str, envelope: dict[str, Any], timeout: float, result: Attempt) -> None:
    r = client.post(base + "/agent/execute", json=envelope, timeout=httpx.Timeout(timeout, connect=2.0))
    result.http = r.status_code
    body = r.json()
    result.code = code_of(body)
    result.answer = answer_of(body)


def _sse(client: httpx.Client, base: str, envelope: dict[str, Any], timeout: float, result: Attempt) -> None:
    deadline = time.monotonic() + timeout
    headers = {"accept": "text/event-stream"}
    with client.stream("POST", base + "/agent/execute", json=envelope, headers=headers,
                       timeout=httpx.Timeout(timeout, connect=2.0)) as r:
        result.http = r.status_code
        if not r.headers.get("content-type", "").startswith("text/event-stream"):
            body = json.loads(r.read())
            result.code = code_of(body)
            result.answer = answer_of(body)
            return
        event = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "execution.completed":
                body = json.loads(line[6:])
                body.pop("replayed", None)
                result.code = code_of(body)
                result.answer = answer_of(body)
                return
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout("the stream ran past the attempt's timeout")


def _async(client: httpx.Client, base: str, envelope: dict[str, Any], timeout: float, result: Attempt) -> None:
    """POST with ``Prefer: respond-async``, then GET the execution until it is finished. A
    transport error or a 503 while polling ends the attempt: the next one POSTs again."""
    deadline = time.monotonic() + timeout
    short = httpx.Timeout(5.0, connect=2.0)
    r = client.post(base + "/agent/execute", json=envelope, headers={"prefer": "respond-async"}, timeout=short)
    while True:
        result.http = r.status_code
        body = r.json()
        result.code = code_of(body)
        if r.status_code == 404 and result.execution_id:
            result.gone = True  # the execution we were given is not known any more
            return
        if r.status_code != 202:
            result.answer = answer_of(body)
            return
        result.execution_id = body["execution_id"]
        if time.monotonic() + POLL_S > deadline:
            return
        time.sleep(POLL_S)
        r = client.get(f"{base}/agent/executions/{result.execution_id}", timeout=short)
