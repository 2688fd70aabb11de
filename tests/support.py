"""Real processes for tests: a redis-server, workers and API servers, each on a free port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette

from api.settings import ApiSettings

# Starting processes and waiting for them is shared with the benchmark; tests may import bench/,
# never the other way round.
from bench.processes import ROOT, Proc, RedisServer, StartError, free_port, on_free_port, try_check, wait_until
from carmy_worker.store import keys

__all__ = ["ROOT", "Call", "Load", "Proc", "RedisServer", "Sample", "Stack", "StartError", "app_settings", "free_port",
           "marked", "new_tmp", "private_redis", "serving", "turns_until", "wait_until", "wait_until_async"]

# Seconds a worker or API process may take to be ready. Generous, for a busy machine: a process
# that exits stops the wait at once, with its log in the error.
START_TIMEOUT = 30.0


async def wait_until_async(check: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> object:
    """``wait_until`` for a test running in the event loop (which serves the in-process app):
    sleeps without blocking it. ``check`` is synchronous and quick (a file, a Redis key)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        value, last = try_check(check, last)
        if value:
            return value
        await asyncio.sleep(0.02)
    raise TimeoutError(f"{what}: not met within {timeout:g} s (last error: {last!r})")


async def turns_until(check: Callable[[], object], what: str = "condition", turns: int = 1000) -> object:
    """``wait_until_async`` one turn of the event loop at a time, checking between turns: for a
    state the next turns may end (a call written and not answered yet, calls queued and not
    sent yet), which a sleep could step over."""
    for _ in range(turns):
        if value := check():
            return value
        await asyncio.sleep(0)
    raise TimeoutError(f"{what}: not met within {turns} turns of the event loop")


# Where the API of a test that must not reach Redis looks for it: nothing listens on port 1, so a
# stray call fails at once instead of reaching a developer's own Redis on the default port.
NO_REDIS = "redis://127.0.0.1:1/0"


def mcp_message(r: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message answering a POST to ``/mcp``: the body, or the last event of the SSE
    stream the server may answer with instead."""
    if r.headers["content-type"].startswith("text/event-stream"):
        message: dict[str, Any] = json.loads([line[5:] for line in r.text.splitlines() if line.startswith("data:")][-1])
        return message
    answer: dict[str, Any] = r.json()
    return answer


def app_settings(redis_url: str = NO_REDIS, **overrides: Any) -> ApiSettings:
    """The ``ApiSettings`` of an API under test: the defaults against ``redis_url``, but for
    ``overrides``; over as many partitions as the test process (``CARMY_REDIS_PARTITIONS``)."""
    return ApiSettings(redis_url=redis_url, **{"redis_partitions": keys.partition_count(), **overrides})


class Stack:
    """Starts workers and API servers against one Redis, and cleans them up."""

    def __init__(self, redis_url: str, tmp: Path) -> None:
        self.redis_url = redis_url
        self.tmp = tmp
        self.procs: list[Proc] = []
        self._count = 0

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        # CARMY_REDIS_PARTITIONS goes through: every process of a run names its keys alike.
        env = {k: v for k, v in os.environ.items() if not k.startswith("CARMY_") or k == "CARMY_REDIS_PARTITIONS"}
        env.update({"CARMY_REDIS_URL": self.redis_url, "CARMY_TEST_DIR": str(self.tmp), "PYTHONPATH": str(ROOT),
                    "PYTHONUNBUFFERED": "1"})
        env.update(extra or {})
        return env

    def _start(self, kind: str, args: list[str], env: dict[str, str]) -> Proc:
        self._count += 1
        name = f"{kind}-{self._count}"
        proc = Proc(name, args, env, self.tmp / f"{name}.log", kind)
        self.procs.append(proc)
        return proc

    def worker(self, module: str | None = "tests.toolsets.basic", env: dict[str, str] | None = None,
               wait: bool = True, args: tuple[str, ...] = ()) -> Proc:
        """``python -m carmy_worker MODULE ARGS...`` (``--openapi SPEC``, say, with or without a
        module); with ``wait``, returned once it serves (StartError, with the end of its log, if
        it exits first)."""
        command = [sys.executable, "-m", "carmy_worker", *([module] if module else []), *args]
        proc = self._start("worker", command, self.env(env))
        if wait:
            proc.wait_for_log("serving", START_TIMEOUT)
        return proc

    def api(self, env: dict[str, str] | None = None) -> tuple[Proc, str]:
        """``python -m api`` on a free port, returned with its base URL once it answers (StartError,
        with the end of its log, if it exits first)."""

        def start(port: int) -> tuple[Proc, str]:
            proc = self._start("api", [sys.executable, "-m", "api"],
                               self.env({"CARMY_PORT": str(port), **(env or {})}))
            base = f"http://127.0.0.1:{port}"
            proc.wait_for_http(base + "/.well-known/agent", START_TIMEOUT)
            return proc, base

        return on_free_port(start)

    def close(self) -> None:
        for proc in self.procs:
            proc.close()


@contextlib.contextmanager
def serving(app: Starlette) -> Iterator[str]:
    """``app`` under uvicorn in a thread of its own (a real server: a client going away is a real
    disconnect, and programs in other languages can call it); yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive())
    if not server.started:
        raise RuntimeError("uvicorn did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


def marked(path: Path, timeout: float = 30.0) -> str:
    """What a tool wrote to ``path`` with ``mark`` (tests/toolsets), once a whole line is there: the
    file exists, just created, a moment before its first line does."""
    def line() -> str:
        text = path.read_text()
        return text if text.endswith("\n") else ""

    return str(wait_until(line, timeout, what=f"{path.name} written"))


def new_tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="carmy-test-"))


@contextlib.contextmanager
def private_redis() -> Iterator[RedisServer]:
    """A redis-server of its own, in a folder of its own; both gone afterwards."""
    workdir = new_tmp()
    server = RedisServer(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


class Call(threading.Thread):
    """A POST that runs in the background, as an agent waiting on its call."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.response: httpx.Response | None = None
        self.finished_at = 0.0
        self.start()

    def run(self) -> None:
        self.response = httpx.post(self.url + "/agent/execute", json=self.body, timeout=60)
        self.finished_at = time.monotonic()

    def result(self, timeout: float = 30) -> httpx.Response:
        self.join(timeout)
        assert self.response is not None, "the call did not finish"
        return self.response


@dataclass
class Sample:
    """One call of a ``Load``: when it was sent, how long it took, and its answer."""

    sent: float
    took: float
    status: int
    code: str | None


class Load(threading.Thread):
    """A call every 50 ms (``body(i)`` for the i-th), each in its own thread and on its own
    connection, until ``finish``: a slow call never holds up the next, and a keep-alive
    connection shared across an outage cannot leave one waiting for good."""

    def __init__(self, base: str, body: Callable[[int], dict[str, Any]]) -> None:
        super().__init__(daemon=True)
        self.base, self.body = base, body
        self.samples: list[Sample] = []
        self.failures: list[str] = []
        self.halt = threading.Event()
        self.calls: list[threading.Thread] = []
        self.start()

    def call(self, i: int) -> None:
        sent = time.monotonic()
        try:
            with httpx.Client(timeout=90) as client:
                r = client.post(self.base + "/agent/execute", json=self.body(i))
            code = r.json().get("error", {}).get("code")
            self.samples.append(Sample(sent, time.monotonic() - sent, r.status_code, code))
        except httpx.HTTPError as exc:
            self.failures.append(repr(exc))

    def run(self) -> None:
        i = 0
        while not self.halt.is_set():
            thread = threading.Thread(target=self.call, args=(i,), daemon=True)
            thread.start()
            self.calls.append(thread)
            i += 1
            time.sleep(0.05)

    def finish(self) -> None:
        self.halt.set()
        self.join(5)
        for thread in self.calls:
            thread.join(90)
