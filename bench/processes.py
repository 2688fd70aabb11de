"""Child processes on free ports, each writing its output to a log file: a private redis-server,
and the helpers to start a server and wait until it is ready.

The one home of these helpers for the benchmark (bench/procs.py) and the tests (tests/support.py).
Nothing here imports tests/: the benchmark runs without them.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

import httpx
import redis

ROOT = Path(__file__).resolve().parent.parent
LOG_TAIL = 2000  # characters of a process's log quoted by an error about that process
_ERROR_MARKS = ('"level": "error"', '"level": "critical"', " ERROR ", " CRITICAL ", "Traceback (most recent")


class StartError(RuntimeError):
    """A process did not come up; the message says whether it exited (and with what code) and
    carries the end of its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


T = TypeVar("T")
PORT_ATTEMPTS = 3


def port_taken(exc: StartError) -> bool:
    """Whether a server failed because its port was in use (redis-server's and uvicorn's words)."""
    return "address already in use" in str(exc).lower()


def on_free_port(start: Callable[[int], T]) -> T:
    """``start(port)`` with a free port; if the server finds it taken, again with another.

    ``free_port`` only finds a port that is free now: until the server binds it, another
    process (a test run beside this one, any outgoing connection) may take it.
    """
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return start(free_port())
        except StartError as exc:
            if attempt == PORT_ATTEMPTS or not port_taken(exc):
                raise
    raise AssertionError("unreachable")


def wait_until(check: Callable[[], object], timeout: float = 30.0, what: str = "condition",
               interval: float = 0.02) -> object:
    """Calls ``check`` until it returns something true, and returns that; an exception it raises
    counts as "not yet". TimeoutError after ``timeout`` seconds: generous by default, since a
    condition met ends the wait at once and a busy machine may take many seconds."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        value, last = try_check(check, last)
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what}: not met within {timeout:g} s (last error: {last!r})")


def try_check(check: Callable[[], object], last: BaseException | None) -> tuple[object, BaseException | None]:
    """One look for ``wait_until`` (and its asyncio twin): the value, and the error it raised if
    any (an error counts as "not yet"), else the last one seen."""
    try:
        return check(), last
    except Exception as exc:
        return None, exc


def status_kib(pid: int, key: str) -> int:
    """A figure of /proc/PID/status in KiB, such as VmRSS (resident now) or VmHWM (its peak)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when the thread that started it
    dies (Linux's PR_SET_PDEATHSIG), so a run that is killed (a timeout, Ctrl-C twice, a
    ``kill``) leaves no server behind to load the machine and hold its port."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the forked child
    pr_set_pdeathsig = 1

    def set_pdeathsig() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return set_pdeathsig


_PREEXEC = _die_with_parent()


def _exit_status(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class Proc:
    """A child process whose output (stdout and stderr) goes to the file ``log``."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path, kind: str = "") -> None:
        self.name = name
        self.kind = kind or name
        self.log = log
        self._file = log.open("wb")
        # The kernel's signal follows the thread that started the child: only the main thread's
        # children get it (another thread may end long before the run).
        in_main = threading.current_thread() is threading.main_thread()
        self.popen = subprocess.Popen(args, env=env, cwd=ROOT, stdout=self._file, stderr=subprocess.STDOUT,
                                      preexec_fn=_PREEXEC if in_main else None)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        if not self._file.closed:
            self._file.flush()
        return self.log.read_text(errors="replace")

    def error_lines(self) -> list[str]:
        """Lines logged at error level or worse (JSON or text logs), and tracebacks."""
        return [line for line in self.output().splitlines()
                if any(mark in line for mark in _ERROR_MARKS)]

    def fail(self, problem: str) -> StartError:
        """The error to raise about this process: ``problem``, whether it still runs, its log's end."""
        code = self.popen.poll()
        state = f"pid {self.pid} still running" if code is None else _exit_status(code)
        return StartError(f"{self.name} {problem}; {state}; its log ({self.log}) ends with:\n"
                          f"{self.output()[-LOG_TAIL:]}")

    def wait_ready(self, ready: Callable[[], object], timeout: float, what: str) -> None:
        """Until ``ready()`` returns something true (an exception it raises counts as "not yet").
        Stops waiting as soon as the process exits: either way, StartError with its log's end.
        ``ready`` must itself be bounded (a socket timeout): the exit is noticed between calls."""
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while self.alive():
            try:
                if ready():
                    return
            except Exception as exc:  # not ready yet
                last = exc
            if time.monotonic() >= deadline:
                raise self.fail(f"not ready within {timeout:g} s (waiting for {what}; last error: {last!r})")
            time.sleep(0.02)
        raise self.fail(f"exited before it was ready (waiting for {what})")

    def wait_for_log(self, text: str, timeout: float) -> None:
        self.wait_ready(lambda: text in self.output(), timeout, f"{text!r} in its log")

    def wait_for_http(self, url: str, timeout: float) -> None:
        """Until a GET of ``url`` answers 200."""
        # One client for every attempt: a new httpx client loads the CA bundle (some 50 ms of CPU),
        # which polling every 20 ms would turn into a busy loop taking a core from the server
        # starting up. Each attempt is bounded (the exit is noticed between attempts); a slow
        # answer on a busy machine is simply asked again.
        with httpx.Client(timeout=2) as client:
            self.wait_ready(lambda: client.get(url).status_code == 200, timeout, f"200 from GET {url}")

    def signal(self, sig: int) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def kill(self) -> None:
        if self.alive():
            self.popen.kill()
            self.popen.wait(5)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (so servers drain and exit cleanly), then SIGKILL if it lingers; closes the log.
        The exit code, or None if it had to be killed."""
        code: int | None = self.popen.poll()
        if code is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                code = self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._file.close()
        return code

    def close(self) -> None:
        """SIGKILL if it still runs; closes the log."""
        self.kill()
        self._file.close()


# How long a replica may go without acknowledging before its primary stops counting it.
MIN_REPLICAS_MAX_LAG_S = 2


class RedisServer:
    """A private redis-server on a free port, without snapshots; ``durable`` turns on the AOF
    (fsync every second), ``replica_of`` (a port on loopback) makes it a replica. It can be
    stopped or killed, and started again on the same port."""

    def __init__(self, workdir: Path, port: int | None = None, *, durable: bool = False,
                 fsync: str = "everysec", replica_of: int | None = None, min_replicas: int = 0) -> None:
        self.workdir = workdir
        # As a primary, refuse writes with fewer replicas than this in touch (min-replicas-to-write).
        self.min_replicas = min_replicas
        self._own_port = port is None  # ours to change if taken before the first start binds it
        self.port = port or free_port()
        self.durable = durable
        self.fsync = fsync  # appendfsync, when durable
        self.replica_of = replica_of
        self._proc: Proc | None = None
        self._starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def proc(self) -> Proc:
        if self._proc is None:
            raise RuntimeError("the redis-server was never started")
        return self._proc

    def start(self, timeout: float = 30.0) -> None:
        """Starts it, on the same port as before if it ran already."""
        if not (self._own_port and self._starts == 0):
            self._start(timeout)
            return

        def first_start(port: int) -> None:
            self.port = port
            self._start(timeout)

        on_free_port(first_start)

    def _start(self, timeout: float) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise StartError("redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)")
        self._starts += 1
        name = "redis" if self._starts == 1 else f"redis-{self._starts}"
        replica = ["--replicaof", "127.0.0.1", str(self.replica_of)] if self.replica_of else []
        self._proc = Proc(name, [
            binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "yes" if self.durable else "no", "--appendfsync", self.fsync,
            "--dir", str(self.workdir), "--maxmemory-policy", "noeviction",
            # As docker-compose.yml and bin/run: a queued job's hash stays a listpack.
            "--hash-max-listpack-value", "256",
            # A replica that connects gets its first copy at once, not 5 s later (the default).
            "--repl-diskless-sync-delay", "0", *replica,
            *(["--min-replicas-to-write", str(self.min_replicas), "--min-replicas-max-lag", str(MIN_REPLICAS_MAX_LAG_S)]
              if self.min_replicas else []),
            *self.extra_args(),
        ], dict(os.environ), self.workdir / f"{name}.log", kind="redis")
        # Each PING is bounded: whatever holds the port may accept and never answer.
        try:
            with redis.Redis.from_url(self.url, socket_timeout=2, socket_connect_timeout=2) as client:
                self._proc.wait_ready(client.ping, timeout, "PING")
        except StartError:
            self._proc.close()
            raise

    def extra_args(self) -> list[str]:
        """More arguments of redis-server, for a subclass (a cluster node's)."""
        return []

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def wait_settled(self, key: str, timeout: float = 30.0) -> None:
        """Until the sorted set ``key`` is empty (Carmy's admission set: no execution pending);
        TimeoutError after ``timeout`` s, since a measurement started then would not be one."""
        with self.client() as client:
            wait_until(lambda: not client.zcard(key), timeout, f"{key} empty", interval=0.01)

    def flush(self) -> None:
        """Forget every key: records, jobs and results of whatever ran before."""
        with self.client() as client:
            client.flushall()

    def kill(self) -> None:
        """SIGKILL: no shutdown, so only what the AOF had fsynced survives."""
        if self._proc is not None:
            self._proc.close()

    def pause(self) -> None:
        """SIGSTOP: a hung server, until ``resume``. Its kernel still accepts connections and
        takes in what is written; nothing is answered, and nothing resets a connection."""
        if self._proc is not None:
            self._proc.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after ``pause``: it reads and answers what waited meanwhile."""
        if self._proc is not None:
            self._proc.signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self._proc is not None:
            self._proc.stop()


def _linked(replica: redis.Redis) -> bool:
    info: dict[str, object] = replica.info("replication")  # type: ignore[assignment]  # sync client
    return info["master_link_status"] == "up"


class SentinelServer:
    """``redis-server --sentinel`` on a free port, watching the primary of ``service`` with quick
    failover settings: a primary silent for ``down_after_ms`` is down, and a failover that
    stalls is tried again after ``failover_timeout_ms``. Sentinel rewrites its own config file."""

    def __init__(self, workdir: Path, primary_port: int, *, service: str, quorum: int = 2,
                 down_after_ms: int = 1000, failover_timeout_ms: int = 3000) -> None:
        self.workdir = workdir
        self.port = 0  # chosen as it starts
        self._settings = [
            f"sentinel monitor {service} 127.0.0.1 {primary_port} {quorum}",
            f"sentinel down-after-milliseconds {service} {down_after_ms}",
            f"sentinel failover-timeout {service} {failover_timeout_ms}",
            f"sentinel parallel-syncs {service} 1",
        ]
        self._proc: Proc | None = None

    def start(self, timeout: float = 30.0) -> None:
        """Starts it on a free port, and on another if that one was taken before it bound it."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise StartError("redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)")

        def start_on(port: int) -> None:
            self.port = port
            config = self.workdir / f"sentinel-{port}.conf"
            config.write_text("\n".join([f"port {port}", "bind 127.0.0.1", f"dir {self.workdir}",
                                          *self._settings, ""]))
            self._proc = Proc(f"sentinel-{port}", [binary, str(config), "--sentinel"], dict(os.environ),
                              self.workdir / f"sentinel-{port}.log", kind="sentinel")
            try:
                with self.client() as client:
                    self._proc.wait_ready(client.ping, timeout, "PING")
            except StartError:
                self._proc.close()
                raise

        on_free_port(start_on)

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2, socket_connect_timeout=2)

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()


class ReplicatedRedis:
    """A primary, its replicas (one by default) and three Sentinels, all on loopback: Redis as
    production runs it, so that tests can kill the primary and watch the failover. ``url`` is
    the Sentinel form of ``CARMY_REDIS_URL``. ``durable`` gives every server its AOF (``fsync``
    is its appendfsync). ``primary`` and ``replicas`` name the servers as started: after a
    failover, ``primary_port`` says which one the Sentinels now name."""

    SERVICE = "carmy"

    def __init__(self, workdir: Path, *, replicas: int = 1, sentinels: int = 3, durable: bool = False,
                 fsync: str = "everysec", min_replicas: int = 0, down_after_ms: int = 1000) -> None:
        self.workdir = workdir
        self.down_after_ms = down_after_ms  # the Sentinels': a primary silent this long is down
        self.durable = durable
        self.fsync = fsync
        # With min_replicas, a primary cut off from its replicas (one the Sentinels demoted but
        # never reached, say) refuses writes instead of taking writes a failover will discard.
        self.min_replicas = min_replicas
        self.primary = RedisServer(self._dir("primary"), durable=durable, fsync=fsync, min_replicas=min_replicas)
        self.replicas: list[RedisServer] = []
        self.sentinels: list[SentinelServer] = []
        self._replica_count = replicas
        self._count = sentinels

    @property
    def replica(self) -> RedisServer | None:
        """The first replica, once started."""
        return self.replicas[0] if self.replicas else None

    def _dir(self, name: str) -> Path:
        path = self.workdir / name  # each server's own: logs and files of the same names
        path.mkdir(exist_ok=True)
        return path

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.SERVICE}"

    def start(self, timeout: float = 30.0) -> None:
        """Primary, then its replica (in sync), then Sentinels that know both and each other."""
        self.primary.start(timeout)
        for i in range(self._replica_count):
            replica = RedisServer(self._dir(f"replica-{i + 1}"), replica_of=self.primary.port,
                                  durable=self.durable, fsync=self.fsync, min_replicas=self.min_replicas)
            replica.start(timeout)
            self.replicas.append(replica)
            with replica.client() as client:
                wait_until(functools.partial(_linked, client), timeout, "replica in sync")
        self.sentinels = [SentinelServer(self.workdir, self.primary.port, service=self.SERVICE,
                                         down_after_ms=self.down_after_ms)
                          for _ in range(self._count)]
        for sentinel in self.sentinels:
            sentinel.start(timeout)
        for sentinel in self.sentinels:  # a failover needs a majority that knows the replica
            with sentinel.client() as client:
                wait_until(functools.partial(self._knows_all, client), timeout, "Sentinels that know each other")

    def _knows_all(self, client: redis.Redis) -> bool:
        state = client.sentinel_master(self.SERVICE)
        return int(state["num-slaves"]) >= self._replica_count and int(state["num-other-sentinels"]) >= self._count - 1

    def primary_port(self) -> int:
        """The port the Sentinels now name as the primary (the first that answers)."""
        for sentinel in self.sentinels:
            with contextlib.suppress(redis.RedisError), sentinel.client() as client:
                return int(client.sentinel_get_master_addr_by_name(self.SERVICE)[1])
        raise redis.ConnectionError("no Sentinel answers")

    def servers(self) -> list[RedisServer]:
        return [self.primary, *self.replicas]

    def server_on(self, port: int) -> RedisServer:
        """The server listening on ``port`` (as ``primary_port`` names it)."""
        return next(server for server in self.servers() if server.port == port)

    def settled(self) -> int | None:
        """The primary's port once the group is whole: every Sentinel names it, it takes writes,
        and every other server replicates from it with its link up (after a restart, once the
        Sentinels have told it whom to follow and it has caught up). None until then."""
        named = set()
        for sentinel in self.sentinels:
            with sentinel.client() as client:
                named.add(int(client.sentinel_get_master_addr_by_name(self.SERVICE)[1]))
        if len(named) != 1:
            return None
        primary = named.pop()
        for server in self.servers():
            with redis.Redis(port=server.port, socket_timeout=2, socket_connect_timeout=2) as client:
                info = client.info("replication")
            ok = info["role"] == "master" if server.port == primary else (
                info["role"] == "slave" and int(info["master_port"]) == primary and info["master_link_status"] == "up")
            if not ok:
                return None
        return primary

    def in_sync(self) -> bool:
        """Whether every replica has everything the primary has written (offsets caught up)."""
        with self.primary.client() as primary:
            wrote = primary.info("replication")["master_repl_offset"]
        for server in self.replicas:
            with server.client() as replica:
                if replica.info("replication")["slave_repl_offset"] < wrote:
                    return False
        return bool(self.replicas)

    def wait_failover(self, old_port: int, timeout: float = 30.0) -> int:
        """Until every Sentinel names another primary than ``old_port``, and it takes writes."""
        def promoted() -> int | None:
            ports = set()
            for sentinel in self.sentinels:
                with sentinel.client() as client:
                    ports.add(int(client.sentinel_get_master_addr_by_name(self.SERVICE)[1]))
            if len(ports) != 1 or old_port in ports:
                return None
            port = ports.pop()
            with redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2) as client:
                return port if client.info("replication")["role"] == "master" else None

        return cast(int, wait_until(promoted, timeout, "failover to the replica"))

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in (self.primary, *self.replicas):
            server.stop()
