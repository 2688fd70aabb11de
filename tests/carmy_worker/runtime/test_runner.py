"""Runtime: one job claimed, run and settled by a worker, against the real Redis: its last resort
(whatever fails after the claim, the job ends with a TOOL_PANIC record) and cancellations that
arrive before the execution started here."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import redis.asyncio

from carmy_worker import Context, Toolbox
from carmy_worker.runtime import presence as presence_module
from carmy_worker.runtime import runner
from carmy_worker.runtime.presence import Presence
from carmy_worker.runtime.queue import Lease, Leases
from carmy_worker.runtime.runner import Runtime
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import jobs, keys, records
from carmy_worker.store.roster import Beat, Holding
from carmy_worker.store.submit import Submit
from carmy_worker.store.verdicts import Verdicts
from carmy_worker.wire import ExecutionJob, WorkerInfo, msgpack_encoder, record_decoder
from tests.support import RedisServer, wait_until_async

tools = Toolbox()


@tools.tool(effect="none")
async def fine(ctx: Context) -> int:
    """Returns 1."""
    return 1


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def fine_in_parallel(ctx: Context) -> int:
    """Returns 1, with no lock to take."""
    return 1


@tools.tool(effect="none", timeout=20)
async def waits(ctx: Context) -> None:
    """Waits until cancelled."""
    await asyncio.sleep(20)


class Whole(msgspec.Struct):
    n: int


@tools.tool(effect="none")
async def takes_a_whole(ctx: Context, input: Whole) -> int:
    """Returns n, under its lock (not parallel_safe)."""
    return input.n


@tools.tool(effect="write", parallel_safe=True)
async def places_a_whole(ctx: Context, input: Whole) -> int:
    """Returns n; may not run twice (BEGIN marks it begun just before it starts)."""
    return input.n


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def gives_up(ctx: Context) -> int:
    """Raises CancelledError, as code does whose awaited task something else cancelled."""
    raise asyncio.CancelledError


CALLS: list[str] = []
STEPS: dict[str, int] = {}  # by execution: the steps its tool took
STOPPED: dict[str, float] = {}  # by execution: when its tool got CancelledError
FINISH: set[str] = set()  # the executions whose tool is to return


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def steps_until_told(ctx: Context) -> int:
    """Takes a step every 10 ms, counted, until told to return."""
    exec_id = ctx.execution_id
    try:
        while exec_id not in FINISH:
            STEPS[exec_id] = STEPS.get(exec_id, 0) + 1
            await asyncio.sleep(0.01)
    except asyncio.CancelledError:
        STOPPED[exec_id] = time.monotonic()
        raise
    return STEPS[exec_id]


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
def counted(ctx: Context) -> int:
    """Counts its calls."""
    CALLS.append(ctx.execution_id)
    return len(CALLS)


@pytest.fixture
async def runtime(redis_server: RedisServer) -> AsyncIterator[Runtime]:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    rt = Runtime(redis=client, tools={t.name: t for t in tools}, settings=WorkerSettings(), worker_id="w-test")
    yield rt
    await rt.released()  # a cancelled tool's lock release, sent after the test: not on a closed client
    rt.close()
    await client.aclose()


async def queued(rt: Runtime, exec_id: str, tool: str, group: str = "g", arguments: bytes = b"{}") -> bytes:
    """Submit an execution of ``tool``: the payload of its job."""
    job = ExecutionJob(execution_id=exec_id, tool=tool, arguments=arguments)
    await Submit(rt.redis, retention=600)(job, group=group, idempotent=False, workers_alive=True,
                                          max_pending=10, queue_wait_ms=60_000, admission_ms=60_000)
    return msgpack_encoder.encode(job)


async def handled(rt: Runtime, tool: str = "fine") -> tuple[str, bytes]:
    """Submit an execution of ``tool`` and handle its job as arq would: its id and stored record."""
    exec_id = keys.new_execution_id()
    await rt.handle(await queued(rt, exec_id, tool))
    raw = await rt.redis.get(keys.record(exec_id))
    assert raw is not None, "the job ended without a record"
    return exec_id, record_decoder.decode(raw).body


async def test_arguments_refused_under_the_tools_lock_let_the_lock_go(runtime: Runtime) -> None:
    """``1.0`` is an integer to JSON Schema (the API lets it through) and not to msgspec: the
    worker refuses it once it holds the tool's lock, which it then kept renewing for ever, and
    every later call of the tool timed out waiting for it."""
    refused = keys.new_execution_id()
    await runtime.handle(await queued(runtime, refused, "takes_a_whole", arguments=b'{"n": 1.0}'))
    raw = await runtime.redis.get(keys.record(refused))
    assert raw is not None and b"INVALID_ARGUMENTS" in record_decoder.decode(raw).body
    await wait_until_async(lambda: not runtime._releases, 5, "the lock's release sent")
    assert await runtime.redis.exists(keys.lock("takes_a_whole")) == 0
    fine_one = keys.new_execution_id()
    await asyncio.wait_for(runtime.handle(await queued(runtime, fine_one, "takes_a_whole", arguments=b'{"n": 3}')), 5)
    raw = await runtime.redis.get(keys.record(fine_one))
    assert raw is not None and msgspec.json.decode(record_decoder.decode(raw).body)["data"] == 3


async def test_arguments_refused_are_refused_before_the_tools_lock_is_waited_for(runtime: Runtime) -> None:
    """Another call holds the tool's lock: a call with arguments the tool cannot take is refused
    at once, not after waiting for the lock as long as its timeout (30 s), and the lock stays the
    other call's."""
    await runtime.redis.set(keys.lock("takes_a_whole"), "exec_other 1 w-other", ex=60)
    refused = keys.new_execution_id()
    await asyncio.wait_for(runtime.handle(await queued(runtime, refused, "takes_a_whole", arguments=b'{"n": 1.0}')), 5)
    raw = await runtime.redis.get(keys.record(refused))
    assert raw is not None and b"INVALID_ARGUMENTS" in record_decoder.decode(raw).body
    assert await runtime.redis.get(keys.lock("takes_a_whole")) == b"exec_other 1 w-other"


async def test_arguments_refused_never_mark_a_tool_that_may_not_run_twice_as_begun(runtime: Runtime) -> None:
    """BEGIN marks a non-idempotent execution begun just before its tool starts (a later attempt
    is then uncertain): arguments refused are refused before it, as the tool never starts."""
    refused, fine_one = keys.new_execution_id(), keys.new_execution_id()
    await runtime.handle(await queued(runtime, refused, "places_a_whole", arguments=b'{"n": "x"}'))
    await runtime.handle(await queued(runtime, fine_one, "places_a_whole", arguments=b'{"n": 3}'))
    raw = await runtime.redis.get(keys.record(refused))
    assert raw is not None and b"INVALID_ARGUMENTS" in record_decoder.decode(raw).body
    assert await runtime.redis.hget(keys.execution(refused), "began") is None
    assert await runtime.redis.hget(keys.execution(fine_one), "began") is not None  # BEGIN's mark, where it ran


async def test_a_tool_that_cancels_itself_is_not_said_to_be_stopped_by_its_caller(runtime: Runtime) -> None:
    _, body = await handled(runtime, "gives_up")
    answer = msgspec.json.decode(body)
    assert answer["status"] == "cancelled" and answer["error"]["code"] == "CANCELLED"
    assert "the tool raised CancelledError itself, with no stop asked of it" in answer["error"]["message"]
    assert "its caller" not in answer["error"]["message"]


async def test_a_record_that_cannot_be_built_becomes_a_tool_panic(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in building the record")

    monkeypatch.setattr(records, "completed", broken)
    with caplog.at_level(logging.ERROR, logger="carmy.worker"):
        exec_id, body = await handled(runtime)
    assert body == records.panic(exec_id, "fine").body
    assert f"execution {exec_id}: its outcome could not be recorded" in caplog.text
    assert "a bug in building the record" in caplog.text


async def test_when_recording_the_panic_fails_too_it_is_still_recorded(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt  # even this, from the worker's own code

    async def record_fails(*args: Any, **kwargs: Any) -> bool:
        raise ValueError("the execution's log line, say")

    monkeypatch.setattr(records, "completed", broken)
    monkeypatch.setattr(runner.Runtime, "_record", record_fails)
    with caplog.at_level(logging.ERROR, logger="carmy.worker"):
        exec_id, body = await handled(runtime)
    assert body == records.panic(exec_id, "fine").body
    assert "recording TOOL_PANIC failed too; trying once more" in caplog.text


async def test_a_cancel_heard_before_the_execution_started_here_is_not_lost(runtime: Runtime) -> None:
    # The API's CANCEL found the execution running (this worker's CLAIM went first) and told every
    # worker; the message reached this one before its own CLAIM reply did.
    exec_id = keys.new_execution_id()
    payload = await queued(runtime, exec_id, "waits")
    runtime.cancel(exec_id)
    await asyncio.wait_for(runtime.handle(payload), 5)  # not the tool's 20 s
    record = record_decoder.decode(await runtime.redis.get(keys.record(exec_id)))
    assert (record.status, record.error_code) == ("cancelled", "CANCELLED")


def test_cancels_of_executions_that_never_come_here_are_forgotten(runtime: Runtime) -> None:
    for i in range(1000):
        runtime.cancel(f"exec_elsewhere_{i}")
    assert len(runtime._early_cancels) == 1000  # all within the memory window
    runtime._early_cancels.update((k, 0.0) for k in list(runtime._early_cancels))  # heard long ago
    runtime.cancel("exec_now")
    assert list(runtime._early_cancels) == ["exec_now"]


async def leased(rt: Runtime, exec_id: str, tool: str) -> tuple[bytes, Lease]:
    """Submit an execution of ``tool`` and lease its job as a worker's LEASE would: its payload
    and the lease, with the claim LEASE made."""
    payload = await queued(rt, exec_id, tool, group=exec_id)  # a queue of its own
    queue = jobs.queue_name(exec_id, keys.partition_of(exec_id))
    [lease] = await Leases(rt.redis, rt.worker_id).take(queue, most=1, lease_ms=60_000, look_ahead=10)
    return payload, lease


async def test_a_job_claimed_with_its_lease_is_held_at_once_and_run_without_another_claim(runtime: Runtime) -> None:
    exec_id = keys.new_execution_id()
    payload, lease = await leased(runtime, exec_id, "fine")
    assert lease.claim is not None and (lease.claim.verdict, lease.claim.attempt) == ("run", 1)
    runtime.admit(payload, lease.claim, lease.token, lease.sent_at)
    # Held from the lease on: a heartbeat now names it, so it is not taken for a stray.
    assert [(h.execution_id, h.attempt) for h in runtime.holdings()] == [(exec_id, 1)]
    await runtime.handle(payload, lease.token)
    record = record_decoder.decode(await runtime.redis.get(keys.record(exec_id)))
    assert record.status == "completed"
    assert await runtime.redis.hget(keys.execution(exec_id), "attempt") == b"1"  # claimed once
    assert runtime.holdings() == []


async def test_a_claim_whose_job_never_reaches_the_handler_is_let_go(
    runtime: Runtime, caplog: pytest.LogCaptureFixture,
) -> None:
    exec_id = keys.new_execution_id()
    payload, lease = await leased(runtime, exec_id, "fine")
    assert lease.claim is not None
    runtime.admit(payload, lease.claim, lease.token, lease.sent_at)
    with caplog.at_level(logging.WARNING, logger="carmy.worker"):
        runtime.forget(lease.token)  # arq's run_job returned without calling the handler
    # No longer held: the next heartbeat, a full one (unsure), finds it a stray, and settles it.
    assert runtime.holdings() == [] and runtime.unsure
    assert f"execution {exec_id} was claimed but its job never reached the handler" in caplog.text
    runtime.forget(lease.token)  # once more, as after a normal run: nothing to do


async def test_what_a_losses_only_heartbeat_reads_is_the_locked_runs_and_attempts_claimed_before_it(
    runtime: Runtime,
) -> None:
    """A heartbeat between full checks reads nothing per execution held: the locks of the runs
    that hold one (``locked_holdings``, kept as each lock is taken and released), and the attempt
    at an execution it names, only if claimed before the beat was sent (``attempt_of``)."""
    before = time.monotonic()
    exec_id = keys.new_execution_id()
    payload, lease = await leased(runtime, exec_id, "waits")  # parallel_safe=False: takes its lock
    assert lease.claim is not None
    runtime.admit(payload, lease.claim, lease.token, lease.sent_at)
    assert runtime.locked_holdings() == []  # claimed, its lock not taken yet
    running = asyncio.create_task(runtime.handle(payload, lease.token))
    await wait_until_async(runtime.locked_holdings, 5, "the tool's lock taken")
    assert runtime.locked_holdings() == [Holding(exec_id, 1, keys.lock("waits"))]
    assert runtime.attempt_of(exec_id, claimed_before=time.monotonic()) == 1
    assert runtime.attempt_of(exec_id, claimed_before=before) is None  # a beat sent before its claim
    runtime.cancel(exec_id)
    await asyncio.wait_for(running, 5)
    assert runtime.locked_holdings() == [] and runtime.attempt_of(exec_id, claimed_before=time.monotonic()) is None


async def test_a_full_heartbeat_hears_of_the_claims_admitted_while_it_is_out(runtime: Runtime) -> None:
    """What LEASE claimed while a full heartbeat was out (after its snapshot of what is held) is
    told to that beat (``watch_admits``), so that it takes none of it for a stray or an orphan;
    a claim admitted before or after is not."""
    before, during, after = (keys.new_execution_id() for _ in range(3))
    leases = {exec_id: await leased(runtime, exec_id, "counted") for exec_id in (before, during, after)}

    def admit(exec_id: str) -> None:
        payload, lease = leases[exec_id]
        assert lease.claim is not None
        runtime.admit(payload, lease.claim, lease.token, lease.sent_at)

    admit(before)
    with runtime.watch_admits() as admitted, runtime.watch_admits() as also:  # ensure_fresh's and the thread's
        admit(during)
    admit(after)
    assert admitted == also == {during}
    for payload, lease in leases.values():
        await runtime.handle(payload, lease.token)


def test_two_beats_watching_admits_at_once_from_two_threads_both_hear_of_them(runtime: Runtime) -> None:
    """The heartbeat thread's full beats and ``ensure_fresh``'s checks, in a thread of their own,
    watch what is admitted at the same time: neither may drop the other's watch as it adds or
    removes its own (a full beat that missed a claim admitted meanwhile would take it for a
    stray). Threads switched as often as Python allows, to meet the race."""
    missed = []

    def watch_often() -> None:
        for _ in range(10_000):
            with runtime.watch_admits() as admitted:
                if not any(w is admitted for w in runtime._watchers):
                    missed.append(admitted)

    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        beats = [threading.Thread(target=watch_often) for _ in range(2)]
        for beat in beats:
            beat.start()
        for beat in beats:
            beat.join(60)
    finally:
        sys.setswitchinterval(switching)
    assert not missed, f"{len(missed)} watches dropped by the other thread"
    assert runtime._watchers == ()


async def test_a_cancel_heard_while_the_lease_was_in_flight_is_not_lost(runtime: Runtime) -> None:
    exec_id = keys.new_execution_id()
    payload, lease = await leased(runtime, exec_id, "waits")
    assert lease.claim is not None
    runtime.cancel(exec_id)  # the cancel message came before LEASE's reply
    runtime.admit(payload, lease.claim, lease.token, lease.sent_at)
    await asyncio.wait_for(runtime.handle(payload, lease.token), 5)  # not the tool's 20 s
    record = record_decoder.decode(await runtime.redis.get(keys.record(exec_id)))
    assert (record.status, record.error_code) == ("cancelled", "CANCELLED")


async def test_a_claim_read_late_whose_execution_moved_on_does_not_start_its_tool(runtime: Runtime) -> None:
    """A LEASE queued behind a BLPOP ran while its worker was stopped; the janitor gave the
    execution back to the queue meanwhile. When the worker reads the reply, seconds late, it asks
    before it starts the tool, finds the attempt no longer its own, and neither runs nor records."""
    exec_id = keys.new_execution_id()
    payload, lease = await leased(runtime, exec_id, "counted")
    assert lease.claim is not None and lease.claim.verdict == "run"
    assert await Verdicts(runtime.redis, retention=600).reap(
        exec_id, "counted", worker_id=runtime.worker_id, why="its worker stopped") == "requeued"
    runtime.admit(payload, lease.claim, lease.token, lease.sent_at - 10)  # read 10 s after it was sent
    await runtime.handle(payload, lease.token)
    assert exec_id not in CALLS
    assert await runtime.redis.get(keys.record(exec_id)) is None  # another attempt will record it
    assert runtime.holdings() == []


async def test_an_execution_leaves_no_garbage_cycle(runtime: Runtime) -> None:
    """What a job builds (its Run, the tool's Context, tasks, futures) is freed by reference
    counting as the job ends: a cycle among them (a closure over the run that the run's own
    context holds, say) would leave each execution's objects to the garbage collector, which
    under load took 5 % of a worker's time finding them."""
    await handled(runtime)  # connections and scripts made once
    gc.collect()
    gc.disable()
    try:
        for _ in range(5):
            await handled(runtime)  # under the tool's lock (parallel_safe=False)
            await handled(runtime, "fine_in_parallel")
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [type(o).__qualname__ for o in gc.garbage
                if type(o).__module__.startswith(("carmy_worker", "asyncio", "_asyncio"))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == [], sorted(set(left))


@pytest.mark.slow
async def test_after_a_pause_no_tool_steps_until_one_check_answers_and_the_loop_runs_meanwhile(
    runtime: Runtime, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker whose heartbeat went stale (it was paused) checks with Redis before its tools'
    next steps: one check, in a thread, which every step that asks meanwhile waits for. Redis
    answers it late here (``CLIENT PAUSE``). Until it does, no tool takes a step, and the event
    loop runs on: a tool whose caller went away is stopped then, and its outcome waits for the
    answer too. Once it answers, the tools whose execution was given away during the pause are
    refused their step, or, stopped meanwhile, drop their outcome without sending it; the
    others go on. (A check made in the event loop held the loop, and every tool, until Redis
    answered.)"""
    monkeypatch.setattr(presence_module, "CHECK_TIMEOUT_S", 10.0)  # outlasts the pause
    presence = Presence(redis=runtime.redis, settings=WorkerSettings(redis_url=redis_server.url),
                        info=WorkerInfo(worker_id=runtime.worker_id, started_ms=0, tools=[], group="g"),
                        runtime=runtime)
    runtime.check_if_stale = presence.ensure_fresh
    answered: list[tuple[float, dict[str, int]]] = []  # when each check's beat answered, and the steps taken then
    beat = presence._checker.heartbeat

    def counted_beat(*args: Any, **kw: Any) -> Beat:
        try:
            return beat(*args, **kw)
        finally:
            answered.append((time.monotonic(), dict(STEPS)))

    presence._checker.heartbeat = counted_beat  # type: ignore[method-assign]
    cancelled, going, given_away, given_away_cancelled = ids = [keys.new_execution_id() for _ in range(4)]
    running = {}
    try:
        for exec_id in ids:
            payload, lease = await leased(runtime, exec_id, "steps_until_told")
            assert lease.claim is not None
            runtime.admit(payload, lease.claim, lease.token, lease.sent_at)
            running[exec_id] = asyncio.create_task(runtime.handle(payload, lease.token))
        await wait_until_async(lambda: all(STEPS.get(e, 0) >= 2 for e in ids), 10, "every tool stepping")
        for lost in (given_away, given_away_cancelled):
            assert await Verdicts(runtime.redis, retention=600).reap(
                lost, "steps_until_told", worker_id=runtime.worker_id, why="its worker stopped") == "requeued"
        await runtime.redis.execute_command("CLIENT", "PAUSE", 3000, "ALL")  # Redis answers nobody for 3 s
        presence.last_beat = time.monotonic() - 60  # the worker was paused
        checking = await wait_until_async(lambda: presence._checking, 10, "a check out")
        assert isinstance(checking, asyncio.Future)
        taken = dict(STEPS)
        runtime.cancel(cancelled)
        runtime.cancel(given_away_cancelled)
        ticks = 0
        while not checking.done():
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks > 10, "the event loop did not run while the check was out"
        assert len(answered) == 1, "the check was made more than once"
        (when, steps_then), = answered
        assert steps_then == taken, "a tool took a step while the check was out"
        assert STOPPED[cancelled] < when and STOPPED[given_away_cancelled] < when, \
            "a cancelled tool waited for the check"
        await asyncio.wait_for(asyncio.gather(running[given_away], running[given_away_cancelled]), 10)
        assert STEPS[given_away] == taken[given_away] and STOPPED[given_away] > when
        for lost in (given_away, given_away_cancelled):
            assert await runtime.redis.get(keys.record(lost)) is None  # its next attempt records
            assert f"execution {lost}: the outcome of attempt 1 is dropped" in caplog.text
        assert "already settled elsewhere" not in caplog.text  # no outcome was sent for either
        await wait_until_async(lambda: STEPS[going] > taken[going], 10, "the tool still held going on")
        FINISH.add(going)
        await asyncio.wait_for(asyncio.gather(running[going], running[cancelled]), 10)
        statuses = [record_decoder.decode(await runtime.redis.get(keys.record(e))).status for e in (going, cancelled)]
        assert statuses == ["completed", "cancelled"] and len(answered) == 1
    finally:
        FINISH.update(ids)
        await asyncio.wait(running.values(), timeout=10)
        presence.close()
