"""How workers wait for jobs: one job wakes one idle worker (a token on the queue's wake list,
popped by one BLPOP), a worker blocked there still stops at once on SIGTERM, and a job runs
under arq's run_job with two round trips of its own (LEASE, which claims the job's execution,
and SETTLE: here the handler stands for the last)."""

from __future__ import annotations

import asyncio
import gc
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from carmy_worker import Context, Toolbox
from carmy_worker.runtime import queue
from carmy_worker.runtime.runner import Runtime
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import jobs, keys, records
from carmy_worker.store.attempts import SETTLE, Attempts, Claim
from carmy_worker.store.batch import FollowUp
from carmy_worker.store.leases import LEASE, Lease, Leases
from carmy_worker.store.scripts import run
from carmy_worker.store.submit import Submit
from carmy_worker.store.verdicts import Verdicts
from carmy_worker.wire import ExecutionJob, job_decoder
from tests.support import RedisServer, turns_until

# These tests pin one partition's path: its commands, its round trips, its looks (LEASE calls).
# Over several partitions a worker waits on each at once (store/wakeups.py): test_served.py.
pytestmark = pytest.mark.skipif(keys.partition_count() > 1, reason="pins one partition's commands and round trips")

GROUP = "wake-test"
# The partition these tests' executions are drawn into (the last: not 0 when there are several).
PARTITION = keys.partition_count() - 1
QUEUE = jobs.queue_name(GROUP, PARTITION)
WAKE = jobs.wake_list(QUEUE)
# So long that only a token (or a freed slot) makes a worker look: a fallback poll would blur
# what the tests count, and a worker that waited it out before stopping would fail them.
NEVER_S = 600.0


@dataclass
class Pool:
    """Workers on one queue, each with its LEASE calls counted."""

    workers: list[queue.WakeableWorker] = field(default_factory=list)
    leases: dict[str, int] = field(default_factory=dict)
    runs: list[tuple[str, bytes]] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


def blocked(r: redis.Redis) -> int:
    """Connections blocked in BLPOP right now."""
    return sum(1 for c in r.client_list() if c["cmd"] == "blpop" and "b" in c["flags"])


async def until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@asynccontextmanager
async def pool_of(url: str, n: int, handler: Callable[[str, bytes, str, FollowUp | None], Awaitable[bool | None]],
                  concurrency: int = 2, admit: queue.Admit | None = None) -> AsyncIterator[Pool]:
    pool = Pool()
    clients = []
    for i in range(n):
        worker_id = f"w{i}"
        client = queue.connect(url)
        clients.append(client)

        async def handle(payload: bytes, lease: str, then: FollowUp | None,
                         worker_id: str = worker_id) -> bool | None:
            pool.runs.append((worker_id, payload))
            return await handler(worker_id, payload, lease, then)

        worker = queue.build_worker(handle, pool=client, worker_id=worker_id, group=GROUP,
                                    concurrency=concurrency, max_timeout=5, drain_seconds=5, admit=admit)
        worker.poll_delay_s = NEVER_S
        pool.leases[worker_id] = 0
        for name in ("take", "wait_and_take"):  # each LEASE, alone or after a BLPOP, is a look
            async def counted(*args: object, worker_id: str = worker_id, take: object = getattr(worker.leases, name),
                              **kwargs: object) -> object:
                pool.leases[worker_id] += 1
                return await take(*args, **kwargs)  # type: ignore[operator]

            setattr(worker.leases, name, counted)
        pool.workers.append(worker)
        pool.tasks.append(asyncio.create_task(worker.async_run()))
    try:
        yield pool
    finally:
        for worker in pool.workers:
            worker.handle_sig(signal.SIGTERM)
        await asyncio.gather(*pool.tasks, return_exceptions=True)
        for worker in pool.workers:
            await worker.close()
        for client in clients:  # their connections, closed now rather than by a later collection
            await client.aclose(close_connection_pool=True)  # queue.connect hands it its pool


async def submit(url: str, exec_id: str) -> None:
    client = redis.asyncio.Redis.from_url(url)
    job = ExecutionJob(execution_id=exec_id, tool="noop", arguments=b"{}")
    got = await Submit(client, retention=600)(job, group=GROUP, idempotent=True, workers_alive=True,
                                              max_pending=100, queue_wait_ms=60_000, admission_ms=60_000)
    assert got.kind == "new"
    await client.aclose()


@pytest.fixture
def r(sync_redis: redis.Redis) -> redis.Redis:
    sync_redis.flushall()
    return sync_redis


async def test_one_job_wakes_exactly_one_worker(r: redis.Redis, redis_server: RedisServer) -> None:
    async def handler(worker_id: str, payload: bytes, lease: str, then: FollowUp | None) -> None:
        return None

    async with pool_of(redis_server.url, 3, handler) as pool:
        await until(lambda: blocked(r) == 3, "three idle workers blocked on the wake list")
        for worker_id in pool.leases:  # each looked once as it started
            pool.leases[worker_id] = 0
        exec_id = keys.new_execution_id(PARTITION)
        await submit(redis_server.url, exec_id)
        await until(lambda: len(pool.runs) == 1 and not r.exists(jobs.job_key(exec_id)), "the job to run and end")
        await until(lambda: blocked(r) == 3, "all three waiting again")
        # One worker popped the one token and looked; the other two never woke.
        assert sorted(pool.leases.values()) == [0, 0, 1]
        assert r.llen(WAKE) == 0
        assert job_decoder.decode(pool.runs[0][1]).execution_id == exec_id
        # arq's FINISH ended the lease (the handler did not settle it): nothing is left of the job.
        assert r.zcard(QUEUE) == 0 and not r.exists(jobs.in_progress_key(exec_id), jobs.retry_key(exec_id))


async def test_a_settle_that_ended_the_lease_leaves_arq_nothing_to_finish(
    r: redis.Redis, redis_server: RedisServer,
) -> None:
    """The handler's SETTLE ends the lease (it says so by returning True): arq's finish_job then
    makes no round trip. The job was read, and its execution claimed, by LEASE: neither arq's
    pipeline nor a CLAIM of its own."""
    client = redis.asyncio.Redis.from_url(redis_server.url)
    claims: dict[str, Claim] = {}

    def admit(payload: bytes, claim: Claim, lease: str, sent_at: float) -> None:
        claims[lease] = claim

    async def handler(worker_id: str, payload: bytes, lease: str, then: FollowUp | None) -> bool:
        exec_id = job_decoder.decode(payload).execution_id
        attempts = Attempts(client, worker_id=worker_id, retention=600, group=GROUP)
        claim = claims.pop(lease)  # admitted before arq's run_job handed the job over
        assert (claim.verdict, claim.attempt) == ("run", 1)
        record = records.completed(exec_id, "noop", b"{}", cacheable=False, duration_ms=1)
        return await attempts.settle(record, exec_id=exec_id, attempt=claim.attempt, lease=lease)

    async with pool_of(redis_server.url, 1, handler, admit=admit) as pool:
        await until(lambda: blocked(r) == 1, "the worker blocked on the wake list")
        exec_id = keys.new_execution_id(PARTITION)
        r.config_resetstat()
        await submit(redis_server.url, exec_id)
        await until(lambda: r.exists(keys.record(exec_id)) == 1 and blocked(r) == 1
                    and all(t.done() for t in pool.workers[0].tasks.values()),
                    "the job to be settled and the worker idle again")
        stats = r.info("commandstats")
        # SUBMIT, LEASE, SETTLE: three scripts; no CLAIM, no FINISH, and no arq pipeline (MULTI/EXEC).
        # (A script's first call fails with NOSCRIPT and is loaded: those failures are not calls.)
        assert stats["cmdstat_evalsha"]["calls"] - stats["cmdstat_evalsha"]["failed_calls"] == 3
        assert "cmdstat_multi" not in stats and "cmdstat_exec" not in stats
        assert r.zcard(QUEUE) == 0 and r.hlen(keys.leases("w0", PARTITION)) == 0
        assert not r.exists(jobs.job_key(exec_id), jobs.in_progress_key(exec_id), jobs.retry_key(exec_id))
    await client.aclose()


@pytest.mark.slow
async def test_a_worker_blocked_on_the_wake_list_stops_at_once_on_sigterm(
    r: redis.Redis, redis_server: RedisServer,
) -> None:
    async def handler(worker_id: str, payload: bytes, lease: str, then: FollowUp | None) -> None:
        return None

    async with pool_of(redis_server.url, 1, handler) as pool:
        await until(lambda: blocked(r) == 1, "the worker blocked on the wake list")
        worker, task = pool.workers[0], pool.tasks[0]
        worker.handle_sig_wait_for_completion(signal.SIGTERM)  # what arq's SIGTERM handler calls
        # Its BLPOP would only time out after NEVER_S: the drain does not wait for it.
        done, _ = await asyncio.wait([task], timeout=30)
        assert done == {task} and task.cancelled()  # arq ends its main task by cancelling it
        # Its own connection is closed, not left blocked.
        await until(lambda: blocked(r) == 0, "the BLPOP connection to go")


async def test_a_quick_jobs_settle_goes_out_before_its_worker_waits_again(
    r: redis.Redis, redis_server: RedisServer,
) -> None:
    """The worker's next BLPOP is not on a quick job's path: the job's SETTLE reaches Redis
    first (``queue.START_TURNS``), as MONITOR sees the commands arrive."""
    client = redis.asyncio.Redis.from_url(redis_server.url)
    claims: dict[str, Claim] = {}

    def admit(payload: bytes, claim: Claim, lease: str, sent_at: float) -> None:
        claims[lease] = claim

    attempts = Attempts(client, worker_id="w0", retention=600, group=GROUP)  # one, as a worker's runtime has

    async def handler(worker_id: str, payload: bytes, lease: str, then: FollowUp | None) -> bool:
        exec_id = job_decoder.decode(payload).execution_id
        record = records.completed(exec_id, "noop", b"{}", cacheable=False, duration_ms=1)
        return await attempts.settle(record, exec_id=exec_id, attempt=claims.pop(lease).attempt, lease=lease)

    assert await commands_of_one_job(r, redis_server, client, attempts, handler, admit) == ["LEASE", "SETTLE", "BLPOP"]
    await client.aclose()


async def test_a_quick_tools_settle_goes_out_before_its_worker_waits_again(
    r: redis.Redis, redis_server: RedisServer,
) -> None:
    """The same through the runtime, with an async tool that returns at once: its task, the
    job's task and arq's run_job take their turns, and START_TURNS is enough for all of them."""
    client = redis.asyncio.Redis.from_url(redis_server.url)
    box = Toolbox()

    @box.tool(effect="none", idempotent=True, parallel_safe=True)
    async def noop(ctx: Context) -> None:
        """Does nothing."""

    runtime = Runtime(redis=client, tools={t.name: t for t in box}, settings=WorkerSettings(), worker_id="w0",
                      group=GROUP)

    async def handler(worker_id: str, payload: bytes, lease: str, then: FollowUp | None) -> bool:
        return await runtime.handle(payload, lease, then)

    attempts = runtime._attempts  # the one batch of SETTLEs the runtime writes on
    order = await commands_of_one_job(r, redis_server, client, attempts, handler, runtime.admit)
    runtime.close()
    await client.aclose()
    assert order == ["LEASE", "SETTLE", "BLPOP"]


async def commands_of_one_job(
    r: redis.Redis, redis_server: RedisServer, client: redis.asyncio.Redis, attempts: Attempts,
    handler: Callable[[str, bytes, str, FollowUp | None], Awaitable[bool]], admit: queue.Admit,
) -> list[str]:
    """LEASE, SETTLE and BLPOP as MONITOR sees them arrive, for one job run by one idle worker
    whose SETTLEs go out on ``attempts``."""
    seen: list[str] = []

    async def watch(monitor: Any) -> None:
        while True:
            command = await monitor.next_command()
            if command["client_type"] != "lua":  # not the commands the scripts run
                seen.append(command["command"])

    async with pool_of(redis_server.url, 1, handler, admit=admit) as pool:
        await until(lambda: blocked(r) == 1, "the worker blocked on the wake list")
        exec_id = keys.new_execution_id(PARTITION)
        # Its batch's connection open, as after a worker's first job: settling nothing writes nothing.
        nothing = records.completed(exec_id, "noop", b"{}", cacheable=False, duration_ms=1)
        assert not await attempts.settle(nothing, exec_id=exec_id, attempt=1)
        async with client.monitor() as monitor:
            watching = asyncio.ensure_future(watch(monitor))
            await submit(redis_server.url, exec_id)
            await until(lambda: r.exists(keys.record(exec_id)) == 1 and blocked(r) == 1
                        and all(t.done() for t in pool.workers[0].tasks.values()),
                        "the job to be settled and the worker waiting again")
            await until(lambda: any(c.startswith("BLPOP") for c in seen), "MONITOR to show the BLPOP")
            watching.cancel()
    order = [c.split()[0] if not c.startswith("EVALSHA") else
             {LEASE.sha: "LEASE", SETTLE.sha: "SETTLE"}.get(c.split()[1], "other script") for c in seen]
    return [c for c in order if c in ("LEASE", "SETTLE", "BLPOP")]


def settling(client: redis.asyncio.Redis, claims: dict[str, Claim],
             gate: asyncio.Event | None = None) -> Callable[[str, bytes, str, FollowUp | None], Awaitable[bool]]:
    """A handler that settles each job as the runtime would, sending ``then`` with its SETTLE,
    once ``gate`` is open."""
    attempts: dict[str, Attempts] = {}

    async def handler(worker_id: str, payload: bytes, lease: str, then: FollowUp | None) -> bool:
        if gate is not None:
            await gate.wait()
        exec_id = job_decoder.decode(payload).execution_id
        mine = attempts.setdefault(worker_id, Attempts(client, worker_id=worker_id, retention=600, group=GROUP))
        record = records.completed(exec_id, "noop", b"{}", cacheable=False, duration_ms=1)
        return await mine.settle(record, exec_id=exec_id, attempt=claims.pop(lease).attempt, lease=lease, then=then)

    return handler


async def test_a_full_workers_next_job_comes_back_with_the_settle_of_its_last(
    r: redis.Redis, redis_server: RedisServer,
) -> None:
    """A slot of a full worker takes its next job with the SETTLE of the one it ran, in the same
    write (``Leases.hand_over``): the worker's own loop does not look again until no job came."""
    client = redis.asyncio.Redis.from_url(redis_server.url)
    claims: dict[str, Claim] = {}
    gate = asyncio.Event()

    def admit(payload: bytes, claim: Claim, lease: str, sent_at: float) -> None:
        claims[lease] = claim

    gc.collect()
    gc.disable()  # what the handoffs leave unreachable stays there, to be looked at below
    async with pool_of(redis_server.url, 1, settling(client, claims, gate), concurrency=1, admit=admit) as pool:
        await until(lambda: blocked(r) == 1, "the worker blocked on the wake list")
        worker = pool.workers[0]
        exec_ids = [keys.new_execution_id(PARTITION) for _ in range(5)]
        await submit(redis_server.url, exec_ids[0])
        await until(lambda: len(pool.runs) == 1, "the first job to start (and wait at the gate)")
        for exec_id in exec_ids[1:]:  # a backlog behind the one slot, busy
            await submit(redis_server.url, exec_id)
        pool.leases["w0"] = 0
        gate.set()
        await until(lambda: all(r.exists(keys.record(e)) for e in exec_ids), "every job settled")
        await until(lambda: blocked(r) == 1 and not worker.tasks, "the worker idle again, its tasks tidied")
        # The four queued jobs came one by one with the SETTLEs; the loop looked once when the last
        # one came back with nothing (the slot freed), and then waited on the wake list.
        assert pool.leases["w0"] <= 2, pool.leases
        ran = [job_decoder.decode(p).execution_id for _, p in pool.runs]
        assert sorted(ran) == sorted(exec_ids)  # once each (jobs queued in one millisecond go by id)
        assert r.zcard(QUEUE) == 0 and r.hlen(keys.leases("w0", PARTITION)) == 0
        assert r.scard(keys.running("w0", PARTITION)) == 0
        assert not any(r.exists(jobs.in_progress_key(e), jobs.job_key(e)) for e in exec_ids)
        assert worker.job_counter == 0 and not claims
        # Freed as each job ended: no cycle (a slot's task and its context, a handoff and its
        # call) left them to the garbage collector.
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            left = {type(o).__qualname__ for o in gc.garbage} & {"Handoff", "_Running", "Lease"}
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert not left
    await client.aclose()


async def test_a_draining_worker_takes_no_next_job_with_its_settle(
    r: redis.Redis, redis_server: RedisServer,
) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    claims: dict[str, Claim] = {}
    gate = asyncio.Event()

    def admit(payload: bytes, claim: Claim, lease: str, sent_at: float) -> None:
        claims[lease] = claim

    async with pool_of(redis_server.url, 1, settling(client, claims, gate), concurrency=1, admit=admit) as pool:
        await until(lambda: blocked(r) == 1, "the worker blocked on the wake list")
        first, queued = keys.new_execution_id(PARTITION), keys.new_execution_id(PARTITION)
        await submit(redis_server.url, first)
        await until(lambda: len(pool.runs) == 1, "the first job to start (and wait at the gate)")
        await submit(redis_server.url, queued)
        pool.workers[0].handle_sig_wait_for_completion(signal.SIGTERM)  # draining from now on
        gate.set()
        await asyncio.wait([pool.tasks[0]], timeout=30)
        assert r.exists(keys.record(first)) and not r.exists(keys.record(queued))
        # Still queued for another worker: not leased, not claimed.
        assert r.zscore(QUEUE, queued) is not None and not r.exists(jobs.in_progress_key(queued))
        assert r.hget(keys.execution(queued), "attempt") in (None, b"0") and len(pool.runs) == 1
    await client.aclose()


async def test_a_job_handed_back_to_its_own_slot_stays_listed_while_it_runs_again(
    r: redis.Redis, redis_server: RedisServer,
) -> None:
    """The job a slot ran, put back while the worker was paused (as REAP does: its lease gone,
    due again), can come back to the same slot with its own SETTLE. Its second run is listed
    (``worker.tasks``, what the heartbeat reports as leased) for as long as it runs: otherwise
    the heartbeat would release its lease, and another worker could run it meanwhile."""
    client = redis.asyncio.Redis.from_url(redis_server.url)
    claims: dict[str, Claim] = {}
    attempts = Attempts(client, worker_id="w0", retention=600, group=GROUP)
    listed: list[bool] = []

    def admit(payload: bytes, claim: Claim, lease: str, sent_at: float) -> None:
        claims[lease] = claim

    async def handler(worker_id: str, payload: bytes, lease: str, then: FollowUp | None) -> bool:
        exec_id = job_decoder.decode(payload).execution_id
        claim = claims.pop(lease)
        listed.append(exec_id in pool.workers[0].tasks)
        if claim.attempt == 1:  # reaped meanwhile: due again, unleased; this attempt's SETTLE writes nothing
            reaped = await Verdicts(client, retention=600).reap(exec_id, "noop", worker_id=worker_id, why="paused",
                                                                attempt=claim.attempt)
            assert reaped == "requeued"
        record = records.completed(exec_id, "noop", b"{}", cacheable=False, duration_ms=1)
        settled = await attempts.settle(record, exec_id=exec_id, attempt=claim.attempt, lease=lease, then=then)
        assert settled == (claim.attempt == 2)
        return settled

    async with pool_of(redis_server.url, 1, handler, concurrency=1, admit=admit) as pool:
        await until(lambda: blocked(r) == 1, "the worker blocked on the wake list")
        exec_id = keys.new_execution_id(PARTITION)
        await submit(redis_server.url, exec_id)
        await until(lambda: r.exists(keys.record(exec_id)) == 1, "the second attempt to settle it")
        assert [job_decoder.decode(p).execution_id for _, p in pool.runs] == [exec_id, exec_id]
        assert listed == [True, True]
        await until(lambda: not pool.workers[0].tasks, "the worker's tasks tidied")
    await client.aclose()


async def test_a_slot_stopped_as_its_settle_goes_out_does_not_run_the_job_it_was_handed(
    r: redis.Redis, redis_server: RedisServer,
) -> None:
    """arq's run_job swallows the cancellation of its job (a shutdown): a job whose task was
    cancelled before its SETTLE's reply came must not run the next job that SETTLE's LEASE
    brought back."""
    client = redis.asyncio.Redis.from_url(redis_server.url)
    claims: dict[str, Claim] = {}
    attempts = Attempts(client, worker_id="w0", retention=600, group=GROUP)
    gate = asyncio.Event()
    first, queued = keys.new_execution_id(PARTITION), keys.new_execution_id(PARTITION)
    settled: list[asyncio.Future[bool]] = []

    def admit(payload: bytes, claim: Claim, lease: str, sent_at: float) -> None:
        claims[lease] = claim

    async def handler(worker_id: str, payload: bytes, lease: str, then: FollowUp | None) -> bool:
        await gate.wait()
        exec_id = job_decoder.decode(payload).execution_id
        record = records.completed(exec_id, "noop", b"{}", cacheable=False, duration_ms=1)
        settled.append(asyncio.ensure_future(attempts.settle(record, exec_id=exec_id,
                                                             attempt=claims.pop(lease).attempt, lease=lease,
                                                             then=then)))
        # SETTLE and its LEASE written (in that task's first step), no reply read yet.
        await turns_until(lambda: attempts._settle.batch._in_flight() == 2, "SETTLE and its LEASE written")
        # They have run, the next job is claimed for this worker, and the loop has read no reply
        # yet (this waits without letting it run).
        deadline = time.monotonic() + 10
        while r.hget(keys.execution(queued), "attempt") != b"1":
            assert time.monotonic() < deadline, "the LEASE sent with the SETTLE never ran"
            time.sleep(0.001)
        pool.workers[0].handle_sig(signal.SIGTERM)  # arq cancels every job now (no drain)
        return await asyncio.shield(settled[0])  # the cancellation, here

    # Its batch's connection open, as after a worker's first job: settling nothing writes nothing.
    nothing = records.completed(first, "noop", b"{}", cacheable=False, duration_ms=1)
    assert not await attempts.settle(nothing, exec_id=first, attempt=1)
    async with pool_of(redis_server.url, 1, handler, concurrency=1, admit=admit) as pool:
        await until(lambda: blocked(r) == 1, "the worker blocked on the wake list")
        await submit(redis_server.url, first)
        await until(lambda: len(pool.runs) == 1, "the first job to start (and wait at the gate)")
        await submit(redis_server.url, queued)
        gate.set()
        await asyncio.wait(pool.tasks, timeout=30)
        assert await settled[0]  # SETTLE wrote the record
        # Its LEASE's reply was read before SETTLE's was handed over: a job the stopped slot
        # wrongly ran would be listed, and is waited for until it has ended.
        await until(lambda: all(t.done() for t in pool.workers[0].tasks.values()), "the worker's jobs ended")
        assert [job_decoder.decode(p).execution_id for _, p in pool.runs] == [first]
    await client.aclose()


async def test_a_full_workers_wait_for_a_slot_never_looks_like_a_shutdown(
    r: redis.Redis, redis_server: RedisServer,
) -> None:
    """A full worker waits for a slot to free up, or for its fallback poll. With an
    ``asyncio.timeout`` as that poll, each expiry cancelled arq's main task until the wait had
    ended. A handoff's reply read in that window took it for a shutdown (``_stopping``), and the
    job its LEASE had claimed waited seconds for the heartbeat to hand it back (the e2e test of a
    job leased by a worker that died before claiming it, one run in six). Here the loop is looked
    at between every two of its callbacks while the poll expires a few hundred times."""
    gate = asyncio.Event()

    async def handler(worker_id: str, payload: bytes, lease: str, then: FollowUp | None) -> None:
        await gate.wait()

    async with pool_of(redis_server.url, 1, handler, concurrency=1) as pool:
        worker = pool.workers[0]
        await until(lambda: blocked(r) == 1, "the worker blocked on the wake list")
        worker.poll_delay_s = 0.001  # its next wait for a slot expires every millisecond
        await submit(redis_server.url, keys.new_execution_id(PARTITION))
        await until(lambda: len(pool.runs) == 1, "the job running: the worker full")
        loop = asyncio.get_running_loop()
        end, seen = loop.time() + 0.3, []

        def look() -> None:
            seen.append(worker._stopping())
            if loop.time() < end:
                loop.call_soon(look)

        look()
        await until(lambda: loop.time() >= end, "the looking done")
        gate.set()
        assert len(seen) > 100 and not any(seen), f"{sum(seen)} of {len(seen)} looks saw a shutdown"


async def test_a_slots_next_job_starts_while_the_job_before_it_still_ends(
    r: redis.Redis, redis_server: RedisServer,
) -> None:
    """The job a SETTLE's LEASE brought back starts as soon as the reply is read: it does not
    wait for the run of the job before it to end (its handler's return, arq's run_job and
    finish_job), which here waits for it."""
    client = redis.asyncio.Redis.from_url(redis_server.url)
    claims: dict[str, Claim] = {}
    attempts = Attempts(client, worker_id="w0", retention=600, group=GROUP)
    gate, second_started = asyncio.Event(), asyncio.Event()
    first, second = keys.new_execution_id(PARTITION), keys.new_execution_id(PARTITION)
    looks: list[int] = []  # the worker loop's own looks for jobs before the second job started

    def admit(payload: bytes, claim: Claim, lease: str, sent_at: float) -> None:
        claims[lease] = claim

    async def handler(worker_id: str, payload: bytes, lease: str, then: FollowUp | None) -> bool:
        exec_id = job_decoder.decode(payload).execution_id
        if exec_id == second:
            looks.append(pool.leases["w0"])
            second_started.set()
        else:
            await gate.wait()
        record = records.completed(exec_id, "noop", b"{}", cacheable=False, duration_ms=1)
        done = await attempts.settle(record, exec_id=exec_id, attempt=claims.pop(lease).attempt, lease=lease,
                                     then=then)
        if exec_id == first:  # the run of the first job lasts until the second has started
            await asyncio.wait_for(second_started.wait(), 10)
        return done

    async with pool_of(redis_server.url, 1, handler, concurrency=1, admit=admit) as pool:
        await until(lambda: blocked(r) == 1, "the worker blocked on the wake list")
        await submit(redis_server.url, first)
        await until(lambda: len(pool.runs) == 1, "the first job to start (and wait at the gate)")
        await submit(redis_server.url, second)
        pool.leases["w0"] = 0
        gate.set()
        await until(lambda: all(r.exists(keys.record(e)) for e in (first, second)), "both jobs settled")
        assert [job_decoder.decode(p).execution_id for _, p in pool.runs] == [first, second]
        assert looks == [0]  # the second came with the first's SETTLE, not from a look of the loop
        worker = pool.workers[0]
        await until(lambda: not worker.tasks and worker.job_counter == 0, "the slot freed, the tasks tidied")
        assert r.hlen(keys.leases("w0", PARTITION)) == 0 and r.scard(keys.running("w0", PARTITION)) == 0 and not claims
    await client.aclose()


async def test_a_lease_sent_with_a_settle_leaves_the_wake_tokens_alone(
    r: redis.Redis, redis_server: RedisServer,
) -> None:
    """It looks a few jobs down the queue only, so it cannot count what is due: it leaves the
    tokens as they are, where a worker's own LEASE sets them to the jobs still due."""
    exec_ids = [keys.new_execution_id(PARTITION) for _ in range(3)]
    for exec_id in exec_ids:
        await submit(redis_server.url, exec_id)  # a token each
    client = queue.connect(redis_server.url)
    leases = Leases(client, "w0")
    taken: list[Lease] = []
    handoff = leases.hand_over(lease_ms=60_000, look_ahead=100, wanted=lambda: QUEUE, on_taken=taken.extend)
    call = handoff.make()
    assert call is not None
    script, keys_, args = call
    reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    reply.set_result(await run(client, script, keys_, args))
    handoff.answered(reply)
    assert len(taken) == 1 and taken[0].job_id in exec_ids and r.llen(WAKE) == 3
    # A worker's own LEASE counts: one job taken, one still due, one token.
    took = await leases.take(QUEUE, most=1, lease_ms=60_000, look_ahead=100)
    assert len(took) == 1 and took[0].job_id in set(exec_ids) - {taken[0].job_id}
    assert r.llen(WAKE) == 1
    await client.aclose(close_connection_pool=True)
