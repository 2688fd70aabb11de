"""Real processes for tests: a redis-server, workers and API servers, each on a free port."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import redis

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], object], timeout: float = 10.0, interval: float = 0.02) -> object:
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # not ready yet
            last_error = exc
        time.sleep(interval)
    raise TimeoutError(f"condition not met in {timeout}s (last error: {last_error!r})")


class Proc:
    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._file = log.open("wb")
        self.popen = subprocess.Popen(args, env=env, cwd=ROOT, stdout=self._file, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        self._file.flush()
        return self.log.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def stop(self, timeout: float = 10.0) -> int | None:
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)

    def close(self) -> None:
        self.kill()
        self._file.close()


class RedisServer:
    """A private redis-server; can be stopped and started again on the same port."""

    def __init__(self, workdir: Path, port: int | None = None, *, durable: bool = False) -> None:
        self.port = port or free_port()
        self.durable = durable
        self.workdir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes" if self.durable else "no", "--appendfsync", "everysec",
             "--dir", str(self.workdir), "--maxmemory-policy", "noeviction"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        wait_until(client.ping)
        client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)


class Stack:
    """Starts workers and API servers against one Redis, and cleans them up."""

    def __init__(self, redis_url: str, tmp: Path) -> None:
        self.redis_url = redis_url
        self.tmp = tmp
        self.procs: list[Proc] = []
        self._count = 0

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CARMY_")}
        env.update({"CARMY_REDIS_URL": self.redis_url, "CARMY_TEST_DIR": str(self.tmp), "PYTHONPATH": str(ROOT),
                    "PYTHONUNBUFFERED": "1"})
        env.update(extra or {})
        return env

    def _log(self, kind: str) -> Path:
        self._count += 1
        return self.tmp / f"{kind}-{self._count}.log"

    def worker(self, module: str = "tests.toolsets.basic", env: dict[str, str] | None = None,
               wait: bool = True) -> Proc:
        proc = Proc([sys.executable, "-m", "carmy_worker", module], self.env(env), self._log("worker"))
        self.procs.append(proc)
        if wait:
            wait_until(lambda: "serving" in proc.output() or proc.popen.poll() is not None, 15)
            if proc.popen.poll() is not None:
                raise RuntimeError("worker exited:\n" + proc.output())
        return proc

    def api(self, env: dict[str, str] | None = None) -> tuple[Proc, str]:
        port = free_port()
        proc = Proc([sys.executable, "-m", "api"], self.env({"CARMY_PORT": str(port), **(env or {})}),
                    self._log("api"))
        self.procs.append(proc)
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(base + "/.well-known/agent", timeout=1).status_code == 200, 15)
        return proc, base

    def close(self) -> None:
        for proc in self.procs:
            proc.close()


def new_tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="carmy-test-"))


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
