"""The jobs of the load: a share of the clients' turns creates a job (``POST /agent/jobs``) in
place of a call, due 0-2 s later (``delay_ms`` or ``run_at``), whose first attempts may fail on
purpose so that it needs retries. A creation is retried with the same request id and body until it
has a job id, as a call is until it has an answer. One watcher thread reads the jobs created so far,
one at a time, all along the run; at the end every job is read until it has finished, then twice
more, seconds apart (``finish``).

Every read that changed something is kept (``Job.reads``): ``chaos.jobcheck`` compares them with
the ledger.
"""

from __future__ import annotations

import datetime
import itertools
import json
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import httpx

from chaos.calls import REFUSAL_CODES, code_of
from chaos.load import new_client
from chaos.model import Create, Job, JobRead, marked

SHARE = 0.15  # of the clients' turns, by default
TOOLS: tuple[tuple[str, float], ...] = (("job_put", 0.6), ("job_charge", 0.4))
WORK_MS = (100, 2000)  # long enough that a kill -9 mostly finds attempts of both tools under way
DELAY_MS = (0, 2000)
# How many first attempts fail on purpose, and how often: 9 is more than any job's budget, so
# such a job ends dead-lettered once its attempts run out.
FAILS: tuple[tuple[int, float], ...] = ((0, 0.6), (1, 0.2), (2, 0.1), (9, 0.1))
MAX_ATTEMPTS = (2, 4)
NOTIFY_SHARE = 0.3  # of the jobs, when a callback receiver runs: they ask for a callback
FINISHED = frozenset({"succeeded", "failed", "dead_lettered", "cancelled"})
WATCH_GAP_S = 0.05  # between two reads of the watcher: about 20 reads a second
READ_GAP_S = 3.0  # between the last two reads of every job
SETTLE_S = 60.0  # the most the end waits for every job to finish
TIMEOUT = httpx.Timeout(5.0, connect=2.0)


def new_job(rng: random.Random, rid: str) -> Job:
    tool = rng.choices([t for t, _ in TOOLS], [w for _, w in TOOLS])[0]
    fail = rng.choices([n for n, _ in FAILS], [w for _, w in FAILS])[0]
    job = Job(rid=rid, tool=tool, args={"ms": rng.randint(*WORK_MS), "fail": fail},
              max_attempts=rng.randint(*MAX_ATTEMPTS), first=time.time())
    delay = rng.randint(*DELAY_MS)
    if rng.random() < 0.5:
        job.delay_ms = delay
    else:
        at = datetime.datetime.fromtimestamp(job.first + delay / 1000, tz=datetime.UTC)
        job.run_at = at.isoformat(timespec="milliseconds")
    return job


def body(job: Job) -> dict[str, Any]:
    """The POST's body: the same on every retry, so the API finds the job it created."""
    doc: dict[str, Any] = {"tool": job.tool, "arguments": marked(job.args), "request_id": job.rid,
                           "max_attempts": job.max_attempts}
    if job.delay_ms is not None:
        doc["delay_ms"] = job.delay_ms
    if job.run_at is not None:
        doc["run_at"] = job.run_at
    if job.notify is not None:
        doc["notify"] = {"url": job.notify}  # every final status, by default
    return doc


def post(client: httpx.Client, base: str, job: Job, phase: Literal["load", "final"]) -> Create:
    """One ``POST /agent/jobs``."""
    result = Create(t0=time.time(), t1=0.0, api=base, phase=phase)
    try:
        r = client.post(base + "/agent/jobs", json=body(job), timeout=TIMEOUT)
        result.http = r.status_code
        doc = r.json()
        result.code = code_of(doc)
        if r.status_code in (200, 202) and isinstance(doc, dict):
            result.job_id = doc.get("job_id")
    except (httpx.HTTPError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    result.t1 = time.time()
    return result


def create(client: httpx.Client, bases: list[str], job: Job, base: str, deadline: float,
           phase: Literal["load", "final"] = "load") -> None:
    """POSTs until a job id, a refusal no retry would change, or ``deadline`` (wall clock)."""
    backoff = 0.1
    while time.time() < deadline:
        result = post(client, base, job, phase)
        job.creates.append(result)
        if result.job_id or result.code in REFUSAL_CODES:
            return
        if result.error is not None or (result.http or 0) >= 500:
            base = bases[(bases.index(base) + 1) % len(bases)]
        time.sleep(min(backoff * random.uniform(0.5, 1.5), max(0.0, deadline - time.time())))
        backoff = min(backoff * 2, 2.0)


def read(client: httpx.Client, base: str, job_id: str) -> JobRead | None:
    """``GET /agent/jobs/{job_id}``: the job, a read with no status if the API does not know it
    (404), or None if the API could not say (no answer, a 503)."""
    try:
        r = client.get(f"{base}/agent/jobs/{job_id}", timeout=TIMEOUT)
        doc = r.json()
    except (httpx.HTTPError, ValueError):
        return None
    if r.status_code == 404 and code_of(doc) == "JOB_NOT_FOUND":
        return JobRead(t=time.time(), status=None)
    if r.status_code != 200:
        return None
    error, notify = doc.get("last_error") or {}, doc.get("notify") or {}
    return JobRead(t=time.time(), status=doc["status"], attempts=doc["attempts"], executions=doc["executions"],
                   created_ms=_ms(doc["created_at"]), error=error.get("code"),
                   result=None if doc.get("result") is None else json.dumps(doc["result"], sort_keys=True),
                   notify=notify.get("state"))


def _ms(rfc3339: str) -> int:
    return round(datetime.datetime.fromisoformat(rfc3339).timestamp() * 1000)


def keep(job: Job, seen: JobRead | None, always: bool = False) -> None:
    """Keeps a read that says something new about ``job`` (``always``: any read, as the last ones)."""
    if seen is not None and (always or not job.reads or job.reads[-1].state() != seen.state()):
        job.reads.append(seen)


def finished(job: Job) -> bool:
    return bool(job.reads) and job.reads[-1].status in FINISHED


class JobLoad:
    """The jobs the clients create (``create``), the watcher, and the end (``finish``)."""

    def __init__(self, bases: list[str], patience: float, run_id: str, share: float = SHARE,
                 notify: str | None = None) -> None:
        self.bases = bases
        self.notify = notify  # the callback receiver's URL: a share of the jobs ask for a callback
        self.patience = patience
        self.run_id = run_id
        self.share = share
        self.jobs: list[Job] = []
        self.client = new_client()
        self.read_at = 0.0  # when the last reads began (wall clock): the reconciliation's cutoff
        self._ids = itertools.count()
        self._ids_lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="job-watcher", daemon=True)

    def start(self) -> None:
        self._watcher.start()

    def create(self, rng: random.Random, base: str) -> None:
        """One job, from a client's thread: posted until it has a job id or its patience is over."""
        with self._ids_lock:
            n = next(self._ids)
        job = new_job(rng, f"{self.run_id}-j{n}")
        if self.notify is not None and rng.random() < NOTIFY_SHARE:
            job.notify = self.notify
        self.jobs.append(job)  # list.append is atomic under the GIL
        create(self.client, self.bases, job, base, job.first + self.patience)

    def _watch(self) -> None:
        for i in itertools.count():
            if self._stop.is_set():
                return
            known = [job for job in list(self.jobs) if job.job_ids()]
            if known:
                job = known[i % len(known)]
                keep(job, read(self.client, self.bases[i % len(self.bases)], min(job.job_ids())))
            time.sleep(WATCH_GAP_S)

    def finish(self, each: float) -> None:
        """The end, once the faults have stopped: every job without a job id posted once more
        (``each`` seconds at most), every job read until it has finished (``SETTLE_S`` at most),
        then read twice more, ``READ_GAP_S`` apart."""
        self._stop.set()
        self._watcher.join()
        self._each(lambda i, job: create(self.client, self.bases, job, self.bases[i % len(self.bases)],
                                         time.time() + each, "final"),
                   [job for job in self.jobs if not job.job_ids()])
        deadline = time.time() + SETTLE_S
        while (waiting := [job for job in self.jobs if job.job_ids() and not finished(job)]) \
                and time.time() < deadline:
            self._read_all(waiting)
            time.sleep(0.2)
        self.read_at = time.time()
        self._read_all(self.jobs, always=True)
        time.sleep(READ_GAP_S)
        self._read_all(self.jobs, always=True)

    def reread(self, jobs: list[Job]) -> None:
        """``jobs`` read once more, every read kept."""
        self._read_all(jobs, always=True)

    def _read_all(self, jobs: list[Job], always: bool = False) -> None:
        def one(i: int, job: Job) -> None:
            if job.job_ids():
                keep(job, read(self.client, self.bases[i % len(self.bases)], min(job.job_ids())), always)

        self._each(one, jobs)

    @staticmethod
    def _each(work: Callable[[int, Job], None], jobs: list[Job]) -> None:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(work, range(len(jobs)), jobs))
