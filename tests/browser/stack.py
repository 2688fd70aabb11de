"""The processes a console test drives: a private redis-server, ``python -m api`` with the console
on and two API keys (an operator's and an agent's), and workers of ``tests.toolsets.jobs``,
which a test may kill (-9) and start again. Calls and jobs are made over HTTP, as an agent would."""

from __future__ import annotations

import contextlib
import datetime
import json
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from carmy_worker.store.jobstore import FINISHED
from tests.conftest import private_stack
from tests.support import Proc, Stack, wait_until

OPERATOR_KEY = "ops-console-key-0123456789"  # carmy:operator: may sign in to the console
PLAIN_KEY = "agent-console-key-0123456789"  # an agent's: may call tools, not sign in
KEYS = {OPERATOR_KEY: {"principal": "ops", "permissions": ["carmy:operator"]},
        PLAIN_KEY: {"principal": "agent", "permissions": []}}
CONSOLE_ENV = {"CARMY_CONSOLE": "1", "CARMY_API_KEYS": json.dumps(KEYS)}
# stamp (a quick call), charge (slow with ``seconds``), flaky (dead-lettered with ``fail_times``).
TOOLSET = "tests.toolsets.jobs"


@dataclass
class Console:
    """A running stack with the console on, at ``base``."""

    base: str
    stack: Stack
    http: httpx.Client
    workers: list[Proc] = field(default_factory=list)

    operator_key = OPERATOR_KEY
    plain_key = PLAIN_KEY

    def url(self, path: str) -> str:
        return self.base + path

    def start_worker(self, module: str = TOOLSET) -> Proc:
        """One more worker, returned once it serves."""
        worker = self.stack.worker(module)
        self.workers.append(worker)
        return worker

    def kill_worker(self, worker: Proc | None = None) -> Proc:
        """SIGKILL ``worker`` (the newest live one by default): it says no goodbye, so the console
        learns of it only when its heartbeats stop (``dead_after``, 3 s)."""
        worker = worker or next(w for w in reversed(self.workers) if w.alive())
        worker.signal(signal.SIGKILL)
        worker.popen.wait(10)
        return worker

    @staticmethod
    def worker_id_prefix(worker: Proc) -> str:
        """How the worker's id begins (carmy_worker/runtime/presence.py: host, pid, random)."""
        return f"{socket.gethostname()}-{worker.pid}-"

    def execute(self, tool: str, arguments: dict[str, Any], key: str = PLAIN_KEY) -> dict[str, Any]:
        """A call over HTTP (POST /agent/execute) as an agent; its answer, once completed."""
        r = self.http.post(self.url("/agent/execute"), json={"tool": tool, "arguments": arguments},
                           headers=bearer(key))
        assert r.status_code == 200, r.text
        answer: dict[str, Any] = r.json()
        return answer

    def finished_ms(self, execution_id: str) -> int:
        """When ``execution_id`` finished, Unix ms (its audit entry's ``finished_at``: Redis's clock,
        this machine's, as the browser's is)."""
        r = self.http.get(self.url("/agent/audit"), headers=bearer(OPERATOR_KEY))
        assert r.status_code == 200, r.text
        [entry] = [e for e in r.json()["entries"] if e["execution_id"] == execution_id and not e["replayed"]]
        return round(datetime.datetime.fromisoformat(entry["finished_at"]).timestamp() * 1000)

    def create_job(self, tool: str, arguments: dict[str, Any], **fields: Any) -> dict[str, Any]:
        r = self.http.post(self.url("/agent/jobs"), json={"tool": tool, "arguments": arguments, **fields},
                           headers=bearer(PLAIN_KEY))
        assert r.status_code == 202, r.text
        job: dict[str, Any] = r.json()
        return job

    def job(self, job_id: str) -> dict[str, Any]:
        r = self.http.get(self.url(f"/agent/jobs/{job_id}"), headers=bearer(OPERATOR_KEY))
        assert r.status_code == 200, r.text
        job: dict[str, Any] = r.json()
        return job

    def dead_letter(self, name: str, fail_times: int = 1000) -> dict[str, Any]:
        """A job of ``flaky`` once it is a dead letter (its 3 fast attempts failed): its first
        ``fail_times`` runs fail, so with 3 the first attempt after a retry succeeds."""
        job_id = self.create_job("flaky", {"name": name, "fail_times": fail_times})["job_id"]
        return self.finished(job_id, "dead_lettered")

    def finished(self, job_id: str, status: str | None = None, timeout: float = 30) -> dict[str, Any]:
        """The job once it has finished (with ``status``, when given)."""
        job: dict[str, Any] = wait_until(lambda: (j := self.job(job_id))["status"] in FINISHED and j, timeout,
                                         what=f"job {job_id} finished")  # type: ignore[assignment]
        assert status is None or job["status"] == status, job
        return job


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@contextlib.contextmanager
def console_stack(env: dict[str, str] | None = None) -> Iterator[Console]:
    """A private redis-server, one worker of ``TOOLSET`` and the API with ``CONSOLE_ENV`` (and
    ``env``), once the API lists the worker's tools; all stopped afterwards."""
    with private_stack() as (_, stack), httpx.Client(timeout=30) as http:
        console = Console("", stack, http)
        console.start_worker()
        _, console.base = stack.api({**CONSOLE_ENV, **(env or {})})
        wait_until(lambda: "stamp" in http.get(console.url("/agent/tools"), headers=bearer(PLAIN_KEY)).text,
                   what="the worker's tools listed by the API")
        yield console
