"""/health, /ready, /metrics and the logs, against real processes."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import private_stack
from tests.support import Proc, RedisServer, Stack, wait_until


@pytest.fixture
def own_redis() -> Iterator[tuple[RedisServer, Stack]]:
    with private_stack() as pair:
        yield pair


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text, 0 if absent."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        sample, _, label_text = key.partition("{")
        found = dict(re.findall(r'(\w+)="([^"]*)"', label_text))
        if sample == name and found == labels:
            return float(value)
    return 0.0


def test_health_and_ready(own_redis: tuple[RedisServer, Stack]) -> None:
    server, stack = own_redis
    _, base = stack.api()
    assert httpx.get(base + "/health").json() == {"ok": True}
    # No worker yet: not ready, and the failing check says why.
    r = httpx.get(base + "/ready")
    assert r.status_code == 503
    body = r.json()
    assert body["ready"] is False
    assert body["checks"]["redis"] == {"ok": True}
    assert body["checks"]["workers"]["error"]["code"] == "NO_WORKERS"

    stack.worker()
    wait_until(lambda: httpx.get(base + "/ready").status_code == 200)
    checks = httpx.get(base + "/ready").json()["checks"]
    memory = checks.pop("memory")
    assert checks == {"redis": {"ok": True}, "workers": {"ok": True, "live": 1}}
    # No maxmemory (this Redis's): never full (tests/e2e/test_redis_memory.py has one that is).
    assert memory["ok"] is True and memory["limit_bytes"] == 0 and memory["used_bytes"] > 0
    server.kill()  # SIGKILL: Redis is gone, as after a crash
    start = time.monotonic()
    r = httpx.get(base + "/ready", timeout=5)
    assert time.monotonic() - start < 2  # each check is bounded
    assert r.status_code == 503
    assert r.json()["checks"]["redis"]["error"]["code"] == "STORE_UNAVAILABLE"
    assert httpx.get(base + "/health").status_code == 200  # the process itself is fine


def test_metrics_move_after_executions(stack: Stack) -> None:
    stack.worker()
    _, base = stack.api()
    wait_until(lambda: "echo" in httpx.get(base + "/agent/tools").text)
    before = httpx.get(base + "/metrics")
    assert before.status_code == 200
    assert before.headers["content-type"].startswith("text/plain")
    ok = metric(before.text, "carmy_executions_total", tool="echo", status="completed", code="")
    with httpx.Client(base_url=base) as c:
        for _ in range(3):
            assert c.post("/agent/execute", json={"tool": "echo", "arguments": {"text": "m"}}).status_code == 200
        assert c.post("/agent/execute", json={"tool": "refuse"}).status_code == 409
    text = httpx.get(base + "/metrics").text
    assert metric(text, "carmy_executions_total", tool="echo", status="completed", code="") == ok + 3
    assert metric(text, "carmy_executions_total", tool="refuse", status="failed", code="OUT_OF_STOCK") >= 1
    assert metric(text, "carmy_execution_run_seconds_count", tool="echo") >= 3
    assert metric(text, "carmy_execution_queue_wait_seconds_count", tool="echo") >= 3
    assert metric(text, "carmy_execution_run_seconds_bucket", tool="echo", le="+Inf") >= 3
    assert metric(text, "carmy_workers_live") == 1
    assert metric(text, "carmy_queue_depth") == 0
    assert metric(text, "carmy_api_execute_responses_total", status_code="200", outcome="completed") >= 3
    assert "carmy_api_sse_streams_open" in text
    assert "carmy_api_executions_in_flight" in text


def json_lines(proc: Proc) -> list[dict[str, object]]:
    lines = []
    for line in proc.output().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue
    return lines


def test_logs_name_the_execution_not_its_arguments(stack: Stack) -> None:
    stack.worker()
    _, base = stack.api()
    wait_until(lambda: "echo" in httpx.get(base + "/agent/tools").text)
    secret = "arg-value-that-must-not-be-logged"
    r = httpx.post(base + "/agent/execute", json={"tool": "echo", "arguments": {"text": secret},
                                                  "request_id": "raw-request-id-42"})
    exec_id = r.json()["execution_id"]

    def line_of(event: str) -> dict[str, object] | None:
        # Other workers of this module's stack may have run it: look at every process.
        return next((e for p in stack.procs for e in json_lines(p)
                     if e.get("event") == event and e.get("execution_id") == exec_id), None)

    wait_until(lambda: line_of("execution") and line_of("request"))
    run = line_of("execution")
    assert run is not None
    assert run["tool"] == "echo" and run["status"] == "completed" and run["error_code"] is None
    assert isinstance(run["run_ms"], int) and isinstance(run["queue_wait_ms"], int)
    assert run["request_id_hash"] and run["request_id_hash"] != "raw-request-id-42"
    request = line_of("request")
    assert request is not None
    assert request["status_code"] == 200 and request["replayed"] is False
    for proc in stack.procs:
        assert secret not in proc.output()
        assert "raw-request-id-42" not in proc.output()

    # A panic's traceback is for the operator, in the worker's log.
    panic = httpx.post(base + "/agent/execute", json={"tool": "explode"}).json()
    wait_until(lambda: any(e.get("exc") and panic["execution_id"] in str(e.get("message"))
                           for p in stack.procs for e in json_lines(p)))
