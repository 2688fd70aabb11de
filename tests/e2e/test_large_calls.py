"""Calls with arguments and results large enough to be staged (``store.staging.STAGE_BYTES``),
through real API and worker processes: answered whole, replayed and refused as any call is, and
nothing staged left behind in Redis."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import redis

from carmy_worker.store.staging import STAGE_BYTES
from tests.support import Stack, wait_until

TEXT = "large " * (STAGE_BYTES // 6 * 2)  # twice the size staged


def call(base: str, text: str, request_id: str | None = None, *, stream: bool = False) -> httpx.Response:
    body: dict[str, object] = {"tool": "echo", "arguments": {"text": text}}
    if request_id is not None:
        body["request_id"] = request_id
    headers = {"accept": "text/event-stream"} if stream else {}
    return httpx.post(base + "/agent/execute", json=body, headers=headers, timeout=30)


def test_large_arguments_are_answered_replayed_and_refused_as_small_ones(stack: Stack,
                                                                         sync_redis: redis.Redis) -> None:
    stack.worker()
    _, base = stack.api()
    wait_until(lambda: "echo" in httpx.get(base + "/agent/tools").text)

    first = call(base, TEXT, "big-1")
    assert first.status_code == 200, first.text
    assert first.json()["data"] == {"text": TEXT}
    again = call(base, TEXT, "big-1")  # a retry: the same answer, not a second run
    assert again.status_code == 200
    assert again.json() == first.json()
    other = call(base, TEXT + "!", "big-1")  # the same request id with other arguments
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "IDEMPOTENCY_CONFLICT"

    streamed = call(base, TEXT, stream=True)
    assert streamed.status_code == 200
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["data"] == {"text": TEXT}

    # Many at once, each with its own text: every answer is its own call's.
    texts = [f"{n}:" + TEXT for n in range(16)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda text: call(base, text), texts))
    assert [a.json()["data"]["text"] for a in answers] == texts

    assert list(sync_redis.scan_iter(match="*staged*")) == []
