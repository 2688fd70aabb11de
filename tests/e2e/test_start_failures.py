"""A process the tests start that cannot come up fails the test with the reason: its exit status
and the end of its log, as soon as it exits (not a refused connection or a timeout later).
One that finds its port taken meanwhile (another test run beside this one) starts on another."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench import processes
from bench.processes import SentinelServer
from tests.support import RedisServer, Stack, StartError


def test_an_api_with_a_bad_setting_fails_with_the_settings_error(stack: Stack) -> None:
    with pytest.raises(StartError) as raised:
        stack.api({"CARMY_MAX_PENDING": "abc"})
    message = str(raised.value)
    assert "exited before it was ready" in message  # the wait ended with the process, not at its timeout
    assert "exit code 2" in message
    assert "api: CARMY_MAX_PENDING must be an integer, got 'abc'" in message


def test_a_worker_with_a_bad_setting_fails_with_the_settings_error(stack: Stack) -> None:
    with pytest.raises(StartError) as raised:
        stack.worker(env={"CARMY_CONCURRENCY": "abc"})
    message = str(raised.value)
    assert "exited before it was ready" in message
    assert "exit code 2" in message
    assert "carmy_worker: CARMY_CONCURRENCY must be an integer, got 'abc'" in message


@pytest.mark.parametrize("kind", ["api", "worker"])
def test_an_unusable_redis_url_fails_at_start_naming_the_setting(stack: Stack, kind: str) -> None:
    env = {"CARMY_REDIS_URL": "redis+sentinel://127.0.0.1:26379"}  # no service name
    with pytest.raises(StartError) as raised:
        stack.api(env) if kind == "api" else stack.worker(env=env)
    message = str(raised.value)
    assert "exit code 2" in message
    assert "CARMY_REDIS_URL cannot be used (the path must be /<service name>" in message


def test_a_worker_of_a_missing_module_fails_with_the_import_error(stack: Stack) -> None:
    with pytest.raises(StartError) as raised:
        stack.worker("tests.toolsets.no_such_module")
    assert "No module named 'tests.toolsets.no_such_module'" in str(raised.value)


def test_a_process_that_never_gets_ready_fails_with_its_log(stack: Stack) -> None:
    worker = stack.worker()
    with pytest.raises(StartError) as raised:
        worker.wait_for_log("a line no worker writes", timeout=0.5)
    message = str(raised.value)
    assert "not ready within 0.5 s" in message
    assert "still running" in message
    assert "serving" in message  # the end of its log


def test_a_redis_server_whose_port_is_taken_fails_with_its_log(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        server = RedisServer(tmp_path, taken.getsockname()[1])
        try:
            with pytest.raises(StartError) as raised:
                server.start()
        finally:
            server.kill()
    assert "exited before it was ready" in str(raised.value)
    assert "Address already in use" in str(raised.value)


@pytest.fixture
def taken_port(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """A port something else holds (as a connection's local port would be), which the next two
    free_port() calls return."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port: int = taken.getsockname()[1]
        handed_out = iter([port, port])
        real = processes.free_port
        monkeypatch.setattr(processes, "free_port", lambda: next(handed_out, None) or real())
        yield port


def test_an_api_whose_port_was_taken_starts_on_another(stack: Stack, taken_port: int) -> None:
    _, base = stack.api()
    assert not base.endswith(f":{taken_port}")
    assert httpx.get(base + "/health").status_code == 200
    assert "address already in use" in stack.procs[-2].output()  # the first try


def test_a_redis_server_whose_port_was_taken_starts_on_another(tmp_path: Path, taken_port: int) -> None:
    server = RedisServer(tmp_path)
    try:
        server.start()
        assert server.port != taken_port
        with server.client() as client:
            assert client.ping()
    finally:
        server.kill()


def test_a_sentinel_whose_port_was_taken_starts_on_another(tmp_path: Path, taken_port: int) -> None:
    sentinel = SentinelServer(tmp_path, 1, service="carmy")  # its primary (port 1) need not run
    try:
        sentinel.start()
        assert sentinel.port != taken_port
        with sentinel.client() as client:
            assert client.ping()
        assert "Address already in use" in (tmp_path / f"sentinel-{taken_port}.log").read_text()  # the first try
    finally:
        sentinel.stop()
