"""Jobs at scale (issue 30): many jobs due in the same second, and what a queued job costs Redis.

* ``due_burst``: ``POST /agent/jobs`` over many kept-alive connections, every job with the same
  ``run_at``; then, from that instant on Redis's clock, when each attempt started (its execution
  hash's ``started_at``) and when each job finished (its hash's ``finished_at``).
* ``queued_memory``: jobs due an hour ahead made with ``JobStore.create`` (the script
  ``POST /agent/jobs`` runs, without HTTP: 100,000 over HTTP would take a minute or more), and
  Redis's ``used_memory`` before and after.

The HTTP client is asyncio streams writing a request built once and reading each answer by its
``Content-Length``: little enough client that the API, not the client, sets the pace.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import msgspec
import redis
from redis.asyncio import Redis

from bench.processes import Proc
from bench.procs import CpuMeter
from carmy_worker.store import keys
from carmy_worker.store.jobstore import JobStore, job_fields, rfc3339
from carmy_worker.wire import ExecutionJob, RetryPolicy, canonical_json_encoder, msgpack_encoder

# A typical small arguments object (``bench.tools.forecast``'s): the memory row's jobs carry it.
MEMORY_TOOL = "forecast"
ARGUMENTS = {"city": "Lisbon", "units": "metric", "days": 3, "include": ["hourly", "alerts"]}
HOUR_MS = 3_600_000
CONNECTIONS = 64  # HTTP connections creating jobs at once
# run_at is this far ahead of the first request, plus CREATE_MS_PER_JOB for each job: time for
# every job to be created before it (this 2-core machine makes 2,500-3,500 a second).
LEAD_MS = 2000
CREATE_MS_PER_JOB = 0.6
READ_CHUNK = 1000  # jobs read back per pipeline


def percentile(ordered: list[int], q: float) -> int:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0


def redis_ms(client: redis.Redis) -> int:
    """Redis's clock, unix ms: the clock of every time a job or an execution holds."""
    seconds, micros = client.time()  # type: ignore[misc]  # sync client
    return int(seconds) * 1000 + int(micros) // 1000


# --- creation over HTTP ----------------------------------------------------------------------


@dataclass
class Posted:
    """What ``post_jobs`` got back: the new jobs' ids, the answers other than 202, how long."""

    job_ids: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


def job_request(host: str, body: dict[str, object]) -> bytes:
    payload = json.dumps(body).encode()
    return (f"POST /agent/jobs HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload


async def _post_loop(host: str, port: int, request: bytes, remaining: list[int], out: Posted) -> None:
    """One kept-alive connection posting ``request`` until ``remaining[0]`` jobs are left."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while remaining[0] > 0:
            remaining[0] -= 1
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            body = await reader.readexactly(length)
            if head.startswith(b"HTTP/1.1 202"):
                out.job_ids.append(msgspec.json.decode(body)["job_id"])
            else:
                out.failures.append(f"{head.split(b' ', 2)[1].decode()} {body[:200]!r}")
    finally:
        writer.close()


async def post_jobs(base: str, body: dict[str, object], count: int, connections: int) -> Posted:
    """``POST /agent/jobs`` with ``body``, ``count`` times over ``connections`` at once."""
    url = urlsplit(base)
    request = job_request(url.netloc, body)
    out, remaining = Posted(), [count]
    started = time.monotonic()
    await asyncio.gather(*(_post_loop(url.hostname or "127.0.0.1", url.port or 80, request, remaining, out)
                           for _ in range(connections)))
    out.seconds = time.monotonic() - started
    return out


# --- the burst -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One job of the burst, read back once every job has finished."""

    status: str
    run_at_ms: int
    finished_ms: int
    started_ms: list[int]  # each attempt's start (Redis's clock)


@dataclass
class DueResult:
    """``jobs`` created over HTTP, all due at the same ``run_at``; times in ms after it (Redis's
    clock). The CPU each kind of process used per job, from ``run_at`` until the last job
    finished, and the same processes' plain executions, to compare with."""

    jobs: int
    connections: int
    create_seconds: float
    slack_ms: int  # from the last job created to run_at (below 0: some were due while others were made)
    all_started_ms: int
    all_finished_ms: int
    lateness_p50_ms: int  # first attempts: started_at − run_at
    lateness_p99_ms: int
    early: int  # attempts started before their job's run_at: a broken promise
    retried: int  # jobs that took more than one attempt
    not_succeeded: int
    cpu: str = ""  # the share of one core each process used meanwhile
    cpu_us_per_job: dict[str, float] = field(default_factory=dict)
    plain_rps: float | None = None  # no-op executions a second on the same processes, 64 clients
    plain_cpu_us: dict[str, float] = field(default_factory=dict)  # and their CPU per execution
    failures: list[str] = field(default_factory=list)  # the first answers other than 202

    @property
    def starts_per_s(self) -> float:
        return self.jobs / max(self.all_started_ms, 1) * 1000


def wait_finished(client: redis.Redis, owner: str, timeout: float) -> None:
    """Until ``owner`` has no unfinished job (its open set is empty)."""
    deadline = time.monotonic() + timeout
    while (left := int(client.zcard(keys.jobs_open(owner, keys.home_partition(owner))))) > 0:  # type: ignore[arg-type]  # sync client
        if time.monotonic() > deadline:
            raise TimeoutError(f"{left} jobs still unfinished after {timeout:g} s")
        time.sleep(0.01)


def read_outcomes(client: redis.Redis, job_ids: list[str]) -> list[Outcome]:
    """Each job's status, run_at and finish, and its attempts' starts from their executions."""
    outcomes = []
    for i in range(0, len(job_ids), READ_CHUNK):
        with client.pipeline(transaction=False) as pipe:
            for job_id in job_ids[i:i + READ_CHUNK]:
                pipe.hmget(keys.job(job_id), ["status", "run_at", "finished_at", "executions"])
            jobs = pipe.execute()
        with client.pipeline(transaction=False) as pipe:
            for *_, executions in jobs:
                for exec_id in (executions or b"").split():
                    pipe.hget(keys.execution(exec_id.decode()), "started_at")
            starts = iter(pipe.execute())
        for status, run_at, finished, executions in jobs:
            started = [next(starts) for _ in (executions or b"").split()]
            outcomes.append(Outcome((status or b"gone").decode(), int(run_at or 0), int(finished or 0),
                                    [int(s) for s in started if s]))
    return outcomes


def due_burst(base: str, url: str, procs: list[Proc], *, tool: str, count: int,
              connections: int = CONNECTIONS) -> DueResult:
    """``count`` jobs of ``tool`` (no arguments) due at the same instant, created over HTTP,
    measured once they have all finished; ``procs``: the processes whose CPU counts."""
    owner = keys.owner(None)
    with redis.Redis.from_url(url) as client:
        run_at = redis_ms(client) + LEAD_MS + round(count * CREATE_MS_PER_JOB)
        posted = asyncio.run(post_jobs(base, {"tool": tool, "arguments": {}, "run_at": rfc3339(run_at)},
                                       count, connections))
        slack = run_at - redis_ms(client)
        time.sleep(max(0.0, slack / 1000 - 0.05))
        with CpuMeter(procs) as cpu:
            wait_finished(client, owner, timeout=60 + count / 50)
        outcomes = read_outcomes(client, posted.job_ids)
    firsts = sorted(min(o.started_ms) - run_at for o in outcomes if o.started_ms)
    jobs = len(outcomes)
    return DueResult(
        jobs=jobs, connections=connections, create_seconds=posted.seconds, slack_ms=slack,
        all_started_ms=max((max(o.started_ms) for o in outcomes if o.started_ms), default=run_at) - run_at,
        all_finished_ms=max((o.finished_ms for o in outcomes), default=run_at) - run_at,
        lateness_p50_ms=percentile(firsts, 0.5), lateness_p99_ms=percentile(firsts, 0.99),
        early=sum(1 for o in outcomes for s in o.started_ms if s < o.run_at_ms),
        retried=sum(1 for o in outcomes if len(o.started_ms) > 1),
        not_succeeded=sum(1 for o in outcomes if o.status != "succeeded"),
        cpu=cpu.summary, cpu_us_per_job={kind: used / jobs * 1e6 for kind, used in cpu.seconds.items()} if jobs else {},
        failures=posted.failures[:5],
    )


# --- memory ----------------------------------------------------------------------------------


@dataclass
class MemoryResult:
    """``jobs`` queued an hour ahead into an empty Redis: its ``used_memory`` before and after."""

    jobs: int
    used_before: int
    used_after: int
    create_seconds: float
    arguments_bytes: int  # the arguments' canonical JSON

    @property
    def bytes_per_job(self) -> float:
        return (self.used_after - self.used_before) / self.jobs


def anonymous_job_fields(tool: str, arguments: bytes) -> list[object]:
    """A job's fields as ``api.calling.jobs.Jobs.create`` writes them for an anonymous caller
    without a request id, with the default retry policy and retentions."""
    template = ExecutionJob(execution_id="", tool=tool, arguments=arguments)
    policy = RetryPolicy()
    return job_fields(tool=tool, owner=keys.owner(None), payload=msgpack_encoder.encode(template), policy=policy,
                      max_attempts=policy.max_attempts, idempotent=True, retention=7 * 86400,
                      dead_retention=30 * 86400, request_id=None)


async def create_queued(url: str, tool: str, count: int, *, delay_ms: int = HOUR_MS, concurrency: int = 32) -> float:
    """``count`` jobs due in ``delay_ms``, with ``JobStore.create`` (``concurrency`` calls in
    flight at once, each on a connection of its own); the seconds it took."""
    fields = anonymous_job_fields(tool, canonical_json_encoder.encode(ARGUMENTS))
    client = Redis.from_url(url, max_connections=concurrency)
    store = JobStore(client)
    remaining = [count]

    async def loop() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            created = await store.create(job_id=store.new_job_id(keys.owner(None)), tool=tool, owner=keys.owner(None),
                                         fields=fields, idempotency=None, fingerprint="", run_at_ms=None,
                                         delay_ms=delay_ms, horizon_ms=2 * delay_ms, max_open=0)
            if created.kind != "new":
                raise RuntimeError(f"JobStore.create refused a job: {created}")

    started = time.monotonic()
    try:
        await asyncio.gather(*(loop() for _ in range(concurrency)))
    finally:
        await client.aclose()
    return time.monotonic() - started


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])  # type: ignore[index]  # sync client


def queued_memory(url: str, count: int, tool: str = MEMORY_TOOL) -> MemoryResult:
    """Redis's memory per job, with ``count`` jobs queued an hour ahead (Redis empty before)."""
    with redis.Redis.from_url(url) as client:
        before = used_memory(client)
        seconds = asyncio.run(create_queued(url, tool, count))
        after = used_memory(client)
        queued = client.zcard(keys.job_due(tool, keys.home_partition(keys.owner(None))))  # the anonymous caller's
    if queued != count:
        raise RuntimeError(f"{queued} jobs in the due set, not {count}")
    return MemoryResult(count, before, after, seconds, len(canonical_json_encoder.encode(ARGUMENTS)))
