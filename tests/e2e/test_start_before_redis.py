"""A worker started before its Redis answers waits for it, as a running worker rides out an
outage, and serves once it is up: an orchestrator starts processes in any order, and a Redis
that restarts reads its append-only file first. It used to stop with a traceback. Credentials
Redis refuses are a setting to fix: the worker stops at once, saying so, exit code 2."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from bench.processes import RedisServer, free_port, wait_until
from tests.support import START_TIMEOUT, Stack


def test_a_worker_started_before_its_redis_serves_once_redis_is_up(stack: Stack, tmp_path: Path) -> None:
    # A port of its own, fixed from the start: the worker names it before anything listens there.
    server = RedisServer(tmp_path, free_port())
    env = {"CARMY_REDIS_URL": server.url}
    worker = stack.worker(env=env, wait=False)
    try:
        worker.wait_for_log("Redis unreachable at start", START_TIMEOUT)
        assert worker.alive()
        server.start()
        worker.wait_for_log("serving", START_TIMEOUT)
        _, base = stack.api(env)
        with httpx.Client(base_url=base, timeout=30) as client:
            wait_until(lambda: "echo" in client.get("/agent/tools").text, START_TIMEOUT, "the worker's tools listed")
            answer = client.post("/agent/execute", json={"tool": "echo", "arguments": {"text": "late"}})
        assert answer.status_code == 200, answer.text
        assert answer.json()["data"] == {"text": "late"}
        output = worker.output()
        assert output.count("Redis unreachable at start") == 1  # said once, not at every try
        assert "Redis reachable: starting" in output
        assert "Traceback" not in output
    finally:
        worker.close()
        server.kill()


@pytest.mark.parametrize("url", ["redis://:wrong-password@127.0.0.1:{port}/0", "redis://127.0.0.1:{port}/0"])
def test_credentials_redis_refuses_stop_the_worker_naming_the_setting(stack: Stack, tmp_path: Path, url: str) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        with server.client() as admin:
            admin.config_set("requirepass", "the-password")
        worker = stack.worker(env={"CARMY_REDIS_URL": url.format(port=server.port)}, wait=False)
        assert worker.popen.wait(START_TIMEOUT) == 2
        output = worker.output()
        assert "carmy_worker: CARMY_REDIS_URL: Redis refused the credentials" in output
        assert "Traceback" not in output
    finally:
        server.kill()
