"""The interop suite's machinery: the official TypeScript MCP clients installed with npm, the app
served by uvicorn with one real worker, and ``Agent``, a client script run by node that the tests
give scenarios to and read JSON answers from."""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.app import create_app
from api.settings import ApiKey
from tests.npm import npm_install
from tests.support import Stack, app_settings, serving

HERE = Path(__file__).parent
ANSWER_TIMEOUT = 30.0  # seconds a scenario may take (the slowest waits out a 1 s tool timeout)

TOKEN = "alice-token-0123456789"


# --- the clients, installed when the lock file changes ----------------------------------------

class InstallError(Exception):
    pass


def install_clients() -> str:
    """The clients installed (``tests.npm.npm_install``: ``npm ci`` when the lock file changed),
    with the Node 22 they run on (an npm package: a system's own may be older); returns it."""
    if shutil.which("npm") is None:
        raise InstallError("tests/interop needs npm on PATH (it installs the clients and their Node): install it "
                           "(apt-get install npm) or leave the suite out (--ignore=tests/interop).")
    try:
        return str(npm_install(HERE) / ".bin" / "node")
    except RuntimeError as exc:
        raise InstallError(str(exc)) from exc


_installed: str | InstallError | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Install before the first test, when the suite is selected: a cold ``npm ci`` may take
    longer than a test's timeout, which a fixture's work counts against."""
    global _installed
    if any(Path(item.path).is_relative_to(HERE) for item in session.items):
        try:
            _installed = install_clients()
        except InstallError as exc:
            _installed = exc


@pytest.fixture(scope="session")
def node() -> str:
    """The node that runs the clients, once they are installed."""
    installed = _installed
    if installed is None:  # selected in a way collection did not see: install now
        try:
            installed = install_clients()
        except InstallError as exc:
            installed = exc
    if isinstance(installed, InstallError):
        pytest.fail(str(installed), pytrace=False)
    return installed


# --- the app -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def url(stack: Stack) -> Iterator[str]:
    stack.worker("tests.toolsets.interop")
    with serving(create_app(app_settings(stack.redis_url))) as base:
        yield base + "/mcp"


@pytest.fixture(scope="module")
def keyed_url(stack: Stack, url: str) -> Iterator[str]:
    """A second API process on the same Redis and worker, behind an API key."""
    keys = {TOKEN: ApiKey(principal="alice", permissions=frozenset({"confirm:wipe"}))}
    with serving(create_app(app_settings(stack.redis_url, api_keys=keys))) as base:
        yield base + "/mcp"


# --- the agents --------------------------------------------------------------------------------

class Agent:
    """A client script (tests/interop/<name>.mjs) run by node for the whole module: each
    scenario is a JSON line to its stdin, answered by JSON lines on its stdout (agent.mjs)."""

    def __init__(self, node: str, name: str, log: Path) -> None:
        self.name = name
        self.log = log
        self._log = log.open("w")
        self._proc = subprocess.Popen([node, str(HERE / f"{name}.mjs")], cwd=HERE, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1)
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._ids = itertools.count(1)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                self._answers.put(json.loads(line))
            except json.JSONDecodeError:
                self._answers.put({"stdout": line})
        self._answers.put(None)

    def start(self, scenario: str, url: str, **args: Any) -> int:
        """Send a scenario without waiting for its answer; its id."""
        command_id = next(self._ids)
        self.send({"id": command_id, "scenario": scenario, "url": url, **args})
        return command_id

    def send(self, message: dict[str, Any]) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(message) + "\n")
        self._proc.stdin.flush()

    def next(self, command_id: int, timeout: float = ANSWER_TIMEOUT) -> dict[str, Any]:
        """The next line about scenario ``command_id`` (an event or its answer)."""
        while True:
            try:
                message = self._answers.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"{self.name}: no answer within {timeout:g} s; its log:\n{self._tail()}") from None
            if message is None:
                self._answers.put(None)
                raise AssertionError(f"{self.name} exited ({self._proc.poll()}); its log:\n{self._tail()}")
            if message.get("id") == command_id:
                return message

    def answer(self, command_id: int) -> dict[str, Any]:
        """The final answer to scenario ``command_id``; a scenario that broke fails the test."""
        while "scenario" not in (message := self.next(command_id)):
            pass
        if "failed" in message:
            raise AssertionError(f"{self.name}: scenario {message['scenario']} broke: {message['failed']}\n"
                                 f"{message.get('stack', '')}")
        return message

    def run(self, scenario: str, url: str, **args: Any) -> dict[str, Any]:
        return self.answer(self.start(scenario, url, **args))

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(5)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._log.close()

    def _tail(self) -> str:
        self._log.flush()
        return "\n".join(self.log.read_text().splitlines()[-40:])


@contextlib.contextmanager
def running(node: str, name: str, stack: Stack) -> Iterator[Agent]:
    agent = Agent(node, name, stack.tmp / f"{name}.log")
    try:
        yield agent
    finally:
        agent.close()
