"""invoke(): every way a tool call can end, turned into an Outcome."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypedDict

import msgspec
import pytest

from carmy_worker import AgentContext, Context, Tool, Toolbox, ToolError
from carmy_worker.loop import Signal
from carmy_worker.runtime.invoke import STOP_GRACE, Outcome, invoke
from carmy_worker.sdk.errors import MAY_HAVE_COMMITTED
from carmy_worker.wire import ErrorBody
from tests.support import turns_until

tools = Toolbox()
SECRET = "secret-database-password-hunter2"
LIMIT = 1000  # max_result_bytes of these calls


class EchoInput(msgspec.Struct):
    text: str
    times: int = 1


class EchoOutput(msgspec.Struct):
    text: str


class Pair(TypedDict):
    a: int
    b: int


class Count(msgspec.Struct):
    n: int


# Threading events the tools set so a test can see what happened inside them.
async_started = threading.Event()
async_cancelled = threading.Event()
sync_started = threading.Event()
sync_saw_cancel = threading.Event()


@tools.tool(effect="read")
async def echo(ctx: Context, input: EchoInput) -> EchoOutput:
    """Echo."""
    return EchoOutput(text=input.text * input.times)


@tools.tool(effect="read")
def echo_sync(ctx: Context, input: EchoInput) -> EchoOutput:
    """Echo from a thread, reporting progress first."""
    ctx.progress(1, total=1)
    return EchoOutput(text=input.text * input.times)


@tools.tool(effect="none")
def add(ctx: Context, input: Pair) -> int:
    """Add two numbers."""
    return input["a"] + input["b"]


@tools.tool(effect="none")
async def ping(ctx: Context) -> list[str]:
    """No input."""
    return ["pong", ctx.execution_id]


@tools.tool(effect="none")
async def nothing(ctx: Context) -> None:
    """Returns nothing."""


@tools.tool(effect="none")
async def refuse(ctx: Context) -> Count:
    """Fails on purpose."""
    raise ToolError("OUT_OF_STOCK", "Nothing left.", category="conflict", retryable=True, retry_after=7,
                    suggested_action="wait", details={"sku": "KB-01"})


@tools.tool(effect="none")
async def explode(ctx: Context) -> Count:
    """Raises an unexpected error."""
    raise RuntimeError(SECRET)


@tools.tool(effect="none")
def explode_sync(ctx: Context) -> Count:
    """Raises an unexpected error in a thread."""
    raise KeyError(SECRET)


@tools.tool(effect="none")
async def bad_output(ctx: Context) -> Count:
    """Returns a Count whose n is not an int."""
    return Count(n="not a number")  # type: ignore[arg-type]


@tools.tool(effect="none")
def wrong_type(ctx: Context) -> int:
    """Returns a string although it says int."""
    return "seven"  # type: ignore[return-value]


@tools.tool(effect="none")
async def unencodable(ctx: Context) -> Count:
    """Returns something that is not JSON at all."""
    return object()  # type: ignore[return-value]


@tools.tool(effect="none")
async def slow(ctx: Context) -> Count:
    """Sleeps, noting its start and its cancellation."""
    async_started.set()
    try:
        await asyncio.sleep(5)
    except asyncio.CancelledError:
        async_cancelled.set()
        raise
    return Count(n=1)


cleaned_up: list[str] = []  # what cleans_up did after its cancellation, in order
let_go = asyncio.Event()  # what clings_on ignores its cancellation for


@tools.tool(effect="none")
async def cleans_up(ctx: Context) -> Count:
    """Takes two steps to clean up once cancelled, as closing a connection does."""
    async_started.set()
    try:
        await asyncio.sleep(5)
    except asyncio.CancelledError:
        await asyncio.sleep(0.05)
        cleaned_up.append("closed")
        raise
    return Count(n=1)


@tools.tool(effect="none")
async def clings_on(ctx: Context) -> Count:
    """Ignores every cancellation until let go."""
    while not let_go.is_set():
        try:
            await let_go.wait()
        except asyncio.CancelledError:
            cleaned_up.append("ignored")
    return Count(n=1)


@tools.tool(effect="none")
def slow_sync(ctx: Context) -> Count:
    """Would take 2 s in a thread, but stops when cancelled."""
    sync_started.set()
    for _ in range(200):
        if ctx.cancelled:
            sync_saw_cancel.set()
            return Count(n=0)
        time.sleep(0.01)
    return Count(n=1)


@tools.tool(effect="none")
async def gives_up(ctx: Context) -> Count:
    """Cancels itself."""
    raise asyncio.CancelledError


@tools.tool(effect="none")
def quits(ctx: Context) -> None:
    """Calls sys.exit, as careless code does."""
    raise SystemExit(3)


@tools.tool(effect="none")
async def quits_async(ctx: Context) -> None:
    """Calls sys.exit from a coroutine: asyncio would end the whole event loop with it."""
    raise SystemExit(3)


@tools.tool(effect="none")
async def interrupts_async(ctx: Context) -> None:
    """Raises KeyboardInterrupt from a coroutine."""
    raise KeyboardInterrupt


class Unprintable(Exception):
    """Its text cannot be read: str and repr raise."""

    def __str__(self) -> str:
        raise RuntimeError(SECRET)

    def __repr__(self) -> str:
        raise RuntimeError(SECRET)


class Boom(BaseException):
    """A tool's own BaseException."""


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


class Measure(msgspec.Struct):
    value: float


class Sized(msgspec.Struct):
    size: int


@tools.tool(effect="none")
async def text_of(ctx: Context, input: Sized) -> str:
    """Returns ``size`` bytes of JSON."""
    return "x" * (input.size - 2)


@tools.tool(effect="none")
async def deep(ctx: Context) -> Any:
    """Returns a value nested past the encoder's depth."""
    return nested(100_000)


@tools.tool(effect="none")
async def nan_measure(ctx: Context) -> Measure:
    """NaN where a float is due."""
    return Measure(value=float("nan"))


@tools.tool(effect="none")
async def nan_anything(ctx: Context) -> Any:
    """NaN where anything goes."""
    return [float("nan"), float("inf")]


@tools.tool(effect="none")
def stops_iteration(ctx: Context) -> None:
    """StopIteration from a thread, which asyncio cannot carry out of it."""
    raise StopIteration


@tools.tool(effect="none")
async def exits_generator(ctx: Context) -> None:
    """GeneratorExit from a coroutine."""
    raise GeneratorExit


@tools.tool(effect="none")
async def booms(ctx: Context) -> None:
    """The tool's own BaseException."""
    raise Boom


@tools.tool(effect="none")
async def unprintable(ctx: Context) -> None:
    """An exception whose text cannot be read."""
    raise Unprintable


@tools.tool(effect="none")
def unprintable_sync(ctx: Context) -> None:
    """An exception whose text cannot be read, from a thread."""
    raise Unprintable


TO_RAISE: list[BaseException] = []  # what ``raises`` raises: a test puts it there


@tools.tool(effect="none")
async def raises(ctx: Context) -> None:
    """Raises what the test asked for."""
    raise TO_RAISE.pop()


def tool(name: str) -> Tool:
    found = tools.get(name)
    assert found is not None
    return found


steps_taken: list[str] = []


@tools.tool(effect="write")
async def steps(ctx: Context) -> Count:
    """Three steps, each after an await, noted as it is taken."""
    steps_taken.append("first")
    try:
        await asyncio.sleep(0)
        steps_taken.append("second")
        await asyncio.sleep(0.01)
        steps_taken.append("third")
    except asyncio.CancelledError:
        steps_taken.append("cancelled")
        raise
    return Count(n=len(steps_taken))


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=4)
    yield pool
    pool.shutdown(wait=True)


class Call:
    """One invoke() with its context and the events the tool emitted."""

    def __init__(self, name: str, arguments: bytes = b"{}", may_step: Any = lambda: True) -> None:
        self.tool = tool(name)
        self.may_step = may_step  # every async tool of these tests runs step by step
        self.arguments = arguments
        self.events: list[bytes] = []
        self.ctx = Context(execution_id="exec_42", tool=name, request_id=None, agent=AgentContext(),
                           emit=lambda data, _partial: self.events.append(data))
        self.cancelled = Signal()

    async def run(self, executor: ThreadPoolExecutor, timeout: float = 5) -> Outcome:
        return await invoke(self.tool, self.ctx, self.arguments, timeout=timeout, executor=executor,
                            cancelled=self.cancelled, max_result_bytes=LIMIT, may_step=self.may_step)


async def run(name: str, executor: ThreadPoolExecutor, arguments: bytes = b"{}", timeout: float = 5) -> Outcome:
    return await Call(name, arguments).run(executor, timeout)


def cancel_once(started: threading.Event, call: Call) -> asyncio.Future[None]:
    """Cancels ``call`` as its caller would, once its tool has ``started`` (the tool sets it),
    not before: that would never start it."""
    started.clear()

    async def cancel() -> None:
        assert await asyncio.to_thread(started.wait, 10), "the tool never started"
        call.cancelled.set()

    return asyncio.ensure_future(cancel())


# --- success ----------------------------------------------------------------------------------


async def test_async_success_returns_json(executor: ThreadPoolExecutor) -> None:
    outcome = await run("echo", executor, b'{"text": "ab", "times": 2}')
    assert outcome == Outcome(data=b'{"text":"abab"}')


async def test_sync_success_runs_in_the_executor(executor: ThreadPoolExecutor) -> None:
    call = Call("echo_sync", b'{"text": "x"}')
    outcome = await call.run(executor)
    assert outcome == Outcome(data=b'{"text":"x"}')
    assert [msgspec.json.decode(e)["progress"] for e in call.events] == [1]


async def test_typeddict_input_and_scalar_output(executor: ThreadPoolExecutor) -> None:
    assert await run("add", executor, b'{"a": 2, "b": 3}') == Outcome(data=b"5")


async def test_no_input_tool(executor: ThreadPoolExecutor) -> None:
    assert await run("ping", executor, b"{}") == Outcome(data=b'["pong","exec_42"]')
    assert await run("ping", executor, b" { } ") == Outcome(data=b'["pong","exec_42"]')
    assert await run("nothing", executor) == Outcome(data=b"null")


# --- bad arguments ----------------------------------------------------------------------------


@pytest.mark.parametrize(("arguments", "where"), [
    (b'{"text": 5}', "$.text"),
    (b'{"times": 2}', "text"),
    (b'{"text": "a", "times": "2"}', "$.times"),
    (b'["a"]', "object"),
    (b"{not json", ""),
])
async def test_bad_arguments(executor: ThreadPoolExecutor, arguments: bytes, where: str) -> None:
    outcome = await run("echo", executor, arguments)
    assert outcome.data is None and outcome.error is not None
    assert outcome.error.code == "INVALID_ARGUMENTS"
    assert outcome.error.category == "validation" and outcome.error.recoverable
    assert where in outcome.error.details["reason"]


@pytest.mark.parametrize("arguments", [b'{"x": 1}', b"[]", b"null", b'"{}"', b""])
async def test_no_input_tool_refuses_arguments(executor: ThreadPoolExecutor, arguments: bytes) -> None:
    outcome = await run("ping", executor, arguments)
    assert outcome.error is not None and outcome.error.code == "INVALID_ARGUMENTS"


# --- failures ---------------------------------------------------------------------------------


async def test_tool_error_becomes_exactly_its_fields(executor: ThreadPoolExecutor) -> None:
    outcome = await run("refuse", executor)
    assert outcome == Outcome(error=ErrorBody(
        code="OUT_OF_STOCK", message="Nothing left.", category="conflict", recoverable=True, retryable=True,
        retry_after=7, suggested_action="wait", details={"sku": "KB-01"},
    ))


@pytest.mark.parametrize("name", ["explode", "explode_sync"])
async def test_unexpected_exception_is_a_panic_without_its_text(
    executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    with caplog.at_level(logging.ERROR, logger="carmy.worker"):
        outcome = await run(name, executor)
    assert outcome.error is not None
    assert outcome.error.code == "TOOL_PANIC" and outcome.error.category == "internal"
    assert not outcome.error.recoverable and not outcome.error.retryable
    assert MAY_HAVE_COMMITTED in outcome.error.message
    assert SECRET not in msgspec.json.encode(outcome).decode()
    # ... but the operator sees it, with the execution id.
    assert "exec_42" in caplog.text and SECRET in caplog.text


@pytest.mark.parametrize("name", ["bad_output", "wrong_type", "unencodable"])
async def test_invalid_output(executor: ThreadPoolExecutor, name: str) -> None:
    outcome = await run(name, executor)
    assert outcome.data is None and outcome.error is not None
    assert outcome.error.code == "INVALID_OUTPUT" and outcome.error.category == "internal"
    assert MAY_HAVE_COMMITTED in outcome.error.message


async def test_tool_cancelling_itself(executor: ThreadPoolExecutor) -> None:
    assert await run("gives_up", executor) == Outcome(cancelled=True)


# --- step by step ----------------------------------------------------------------------------


async def test_an_async_tool_asks_before_every_step(executor: ThreadPoolExecutor) -> None:
    steps_taken.clear()
    asked: list[list[str]] = []
    outcome = await Call("steps", may_step=lambda: asked.append(list(steps_taken)) or True).run(executor)
    assert outcome == Outcome(data=b'{"n":3}')
    assert asked == [[], ["first"], ["first", "second"]]


async def test_a_step_refused_is_never_taken_even_if_already_due(executor: ThreadPoolExecutor) -> None:
    """What a worker that finds it lost its execution (after a pause) does: the tool's next step
    is replaced by CancelledError, although the sleep it waited on had ended."""
    steps_taken.clear()
    allowed = iter([True, True])
    outcome = await Call("steps", may_step=lambda: next(allowed, False)).run(executor)
    assert outcome == Outcome(cancelled=True)
    assert steps_taken == ["first", "second", "cancelled"]


class Checks:
    """``may_step`` as a worker's presence answers it after a pause: yes at the tool's first ask,
    a check under way at its second (``checking``, a future the test resolves), then ``after``."""

    def __init__(self, after: bool) -> None:
        self.checking: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.after = after
        self.asked: list[list[str]] = []  # the steps taken at each ask

    def __call__(self) -> bool | asyncio.Future[None]:
        self.asked.append(list(steps_taken))
        if len(self.asked) == 1:
            return True
        return self.checking if len(self.asked) == 2 else self.after


async def check_out(checks: Checks, call: Call, executor: ThreadPoolExecutor) -> asyncio.Task[Outcome]:
    """``call`` run until its tool waits for ``checks``' check, then 50 ms of the loop's turns
    with the check still out, through which the tool takes no step."""
    steps_taken.clear()
    running = asyncio.ensure_future(call.run(executor))
    await turns_until(lambda: len(checks.asked) == 2, "the check asked for")
    ticks = 0
    deadline = time.monotonic() + 0.05
    while time.monotonic() < deadline:
        await asyncio.sleep(0)
        ticks += 1
    assert steps_taken == ["first"] and not running.done(), "a step was taken while the check was out"
    assert ticks > 10, "the event loop did not run while the check was out"
    return running


async def test_a_step_waits_for_a_check_under_way_and_is_taken_once_it_answers(executor: ThreadPoolExecutor) -> None:
    """A worker checking with Redis after a pause: the tool's next step waits for the check,
    while the event loop runs on, and is taken once the check says the worker still holds its
    execution (``may_step`` asked again)."""
    checks = Checks(after=True)
    running = await check_out(checks, call := Call("steps", may_step=checks), executor)
    checks.checking.set_result(None)
    assert await running == Outcome(data=b'{"n":3}')
    assert checks.asked == [[], ["first"], ["first"], ["first", "second"]]
    assert not call.ctx.cancelled


async def test_a_step_a_check_finds_lost_is_never_taken(executor: ThreadPoolExecutor) -> None:
    """The check finds the execution given away: the step that waited for it is replaced by
    CancelledError, and the tool takes no other."""
    checks = Checks(after=False)
    running = await check_out(checks, Call("steps", may_step=checks), executor)
    checks.checking.set_result(None)
    assert await running == Outcome(cancelled=True)
    assert steps_taken == ["first", "cancelled"]


async def test_a_tool_cancelled_while_it_waits_for_a_check_is_told_at_once(executor: ThreadPoolExecutor) -> None:
    """Its caller went away while the check was out: the tool gets the cancel then (its cleanup
    runs, as for any cancel), not once the check answers, and the check is not asked again."""
    checks = Checks(after=True)
    call = Call("steps", may_step=checks)
    running = await check_out(checks, call, executor)
    call.cancelled.set()
    assert await asyncio.wait_for(running, 5) == Outcome(cancelled=True)
    assert steps_taken == ["first", "cancelled"] and len(checks.asked) == 2


# --- timeout and cancellation -----------------------------------------------------------------


async def test_async_timeout_cancels_the_tool(executor: ThreadPoolExecutor) -> None:
    async_cancelled.clear()
    call = Call("slow")
    started = time.monotonic()
    outcome = await call.run(executor, timeout=0.05)
    assert time.monotonic() - started < 1
    assert outcome == Outcome(timed_out=True)
    assert call.ctx.cancelled
    assert await asyncio.to_thread(async_cancelled.wait, 10), "the tool never got CancelledError"


@pytest.mark.parametrize("ending", ["timeout", "cancel"])
async def test_a_cancelled_async_tool_has_cleaned_up_when_its_outcome_is_made(
        executor: ThreadPoolExecutor, ending: str) -> None:
    # Whoever is answered (a DELETE, a timeout) may count on the tool's cleanup having run.
    cleaned_up.clear()
    call = Call("cleans_up")
    canceller = cancel_once(async_started, call) if ending == "cancel" else None
    outcome = await call.run(executor, timeout=0.05 if ending == "timeout" else 5)
    assert outcome == (Outcome(timed_out=True) if ending == "timeout" else Outcome(cancelled=True))
    assert cleaned_up == ["closed"]
    if canceller is not None:
        await canceller


@pytest.mark.slow
async def test_an_async_tool_that_ignores_its_cancellation_is_waited_for_the_grace_only(
        executor: ThreadPoolExecutor) -> None:
    cleaned_up.clear()
    let_go.clear()
    call = Call("clings_on")
    started = time.monotonic()
    try:
        assert await call.run(executor, timeout=0.05) == Outcome(timed_out=True)
        elapsed = time.monotonic() - started
        assert cleaned_up == ["ignored"]
        assert STOP_GRACE <= elapsed < STOP_GRACE + 1, f"answered after {elapsed:.2f}s"
    finally:
        let_go.set()


async def test_sync_timeout_answers_on_time(executor: ThreadPoolExecutor) -> None:
    sync_saw_cancel.clear()
    call = Call("slow_sync")
    started = time.monotonic()
    outcome = await call.run(executor, timeout=0.1)
    elapsed = time.monotonic() - started
    assert outcome == Outcome(timed_out=True)
    assert elapsed < 0.8, f"answered after {elapsed:.2f}s; the tool would run 2s"
    assert call.ctx.cancelled
    assert await asyncio.to_thread(sync_saw_cancel.wait, 10), "the thread never saw ctx.cancelled"


async def test_caller_cancellation(executor: ThreadPoolExecutor) -> None:
    async_cancelled.clear()
    call = Call("slow")
    canceller = cancel_once(async_started, call)
    started = time.monotonic()
    outcome = await call.run(executor, timeout=5)
    assert time.monotonic() - started < 1
    assert outcome == Outcome(cancelled=True)
    await canceller
    assert call.ctx.cancelled
    assert await asyncio.to_thread(async_cancelled.wait, 10), "the tool never got CancelledError"


async def test_caller_cancellation_of_a_sync_tool(executor: ThreadPoolExecutor) -> None:
    sync_saw_cancel.clear()
    call = Call("slow_sync")
    canceller = cancel_once(sync_started, call)
    started = time.monotonic()
    assert await call.run(executor, timeout=5) == Outcome(cancelled=True)
    assert time.monotonic() - started < 0.8  # the tool would run 2 s
    await canceller
    assert await asyncio.to_thread(sync_saw_cancel.wait, 10)


async def test_worker_shutdown_propagates_and_cancels_the_tool(executor: ThreadPoolExecutor) -> None:
    async_cancelled.clear()
    async_started.clear()
    call = Call("slow")
    task = asyncio.ensure_future(call.run(executor, timeout=5))
    assert await asyncio.to_thread(async_started.wait, 10), "the tool never started"
    task.cancel()  # while the tool runs
    with pytest.raises(asyncio.CancelledError):
        await task
    assert call.ctx.cancelled
    assert await asyncio.to_thread(async_cancelled.wait, 10), "the tool never got CancelledError"


async def test_events_after_timeout_are_dropped(executor: ThreadPoolExecutor) -> None:
    call = Call("slow_sync")
    await call.run(executor, timeout=0.05)
    call.ctx.progress(99)
    assert call.events == []


@pytest.mark.parametrize("name", ["quits", "quits_async", "interrupts_async"])
async def test_system_exit_in_a_tool_is_a_panic_not_a_worker_exit(name: str, executor: ThreadPoolExecutor) -> None:
    assert (await run(name, executor)).error == ErrorBody(
        code="TOOL_PANIC", message=f"The tool failed with an unexpected error. {MAY_HAVE_COMMITTED}",
        category="internal", recoverable=False, retryable=False)
    await asyncio.sleep(0)  # the loop that ran it is still serving


# --- what no tool should do, and every worker must survive ------------------------------------


async def test_a_result_over_the_limit_is_invalid_output_saying_by_how_much(executor: ThreadPoolExecutor) -> None:
    assert await run("text_of", executor, b'{"size": %d}' % LIMIT) == Outcome(data=b'"' + b"x" * (LIMIT - 2) + b'"')
    outcome = await run("text_of", executor, b'{"size": %d}' % (LIMIT + 2))
    assert outcome.error is not None and outcome.error.code == "INVALID_OUTPUT"
    assert outcome.error.message == ("The tool's result is 1,002 bytes, 2 bytes over the limit of 1,000 bytes "
                                     f"(CARMY_MAX_RESULT_BYTES). {MAY_HAVE_COMMITTED}")
    assert outcome.error.details == {"size": 1002, "limit": 1000}


async def test_a_result_too_deep_to_encode_is_invalid_output(
    executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="carmy.worker"):
        # The timeout only has to outlast building and encoding 100,000 levels on a busy machine.
        outcome = await run("deep", executor, timeout=60)
    assert outcome.error is not None and outcome.error.code == "INVALID_OUTPUT"
    assert "RecursionError" in caplog.text and "exec_42" in caplog.text


async def test_nan_is_null_which_a_float_refuses(executor: ThreadPoolExecutor) -> None:
    outcome = await run("nan_measure", executor)
    assert outcome.error is not None and outcome.error.code == "INVALID_OUTPUT"
    assert await run("nan_anything", executor) == Outcome(data=b"[null,null]")


@pytest.mark.parametrize("name", ["stops_iteration", "exits_generator", "booms", "unprintable", "unprintable_sync"])
async def test_what_asyncio_cannot_carry_is_a_panic_on_time(
    executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture, name: str,
) -> None:
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="carmy.worker"):
        outcome = await run(name, executor, timeout=5)
    assert time.monotonic() - started < 1  # not the timeout: StopIteration once left the call unfinished
    assert outcome.error is not None and outcome.error.code == "TOOL_PANIC"
    assert "Traceback" in caplog.text and "exec_42" in caplog.text


async def raised(executor: ThreadPoolExecutor, exc: ToolError) -> ErrorBody:
    TO_RAISE.append(exc)
    outcome = await run("raises", executor)
    assert outcome.error is not None
    return outcome.error


@pytest.mark.parametrize(("details", "sent"), [
    ({"sku": "KB-01", "left": [1.5, None]}, {"sku": "KB-01", "left": [1.5, None]}),
    (object(), {"omitted": "The error's details cannot be encoded as JSON."}),
    (nested(100_000), {"omitted": "The error's details cannot be encoded as JSON."}),
    ("x" * LIMIT, {"omitted": "The error's details are 1,002 bytes, over the limit of 1,000 bytes."}),
], ids=["json", "not-json", "too-deep", "too-large"])
async def test_tool_error_details_that_cannot_be_sent_are_replaced_by_a_note(
    executor: ThreadPoolExecutor, details: Any, sent: Any,
) -> None:
    err = await raised(executor, ToolError("E", "m", category="conflict", retry_after=3, details=details))
    assert err == ErrorBody(code="E", message="m", category="conflict", recoverable=False, retryable=False,
                            retry_after=3, details=sent)


async def test_tool_error_fields_of_the_wrong_type_are_made_sendable(executor: ThreadPoolExecutor) -> None:
    exc = ToolError(404, ValueError("gone"), retryable=1, retry_after=1.2,  # type: ignore[arg-type]
                    suggested_action="\ud800 wait")
    exc.category = "bogus"  # type: ignore[assignment]
    assert await raised(executor, exc) == ErrorBody(
        code="404", message="gone", category="internal", recoverable=True, retryable=True, retry_after=2,
        suggested_action="? wait")
    for retry_after in (-1, float("nan"), "soon", True):
        assert (await raised(executor, ToolError("E", "m", retry_after=retry_after))).retry_after is None
    # Past 30 days: cut to them (a job's retry waits that long; past 2^64, no record could hold it).
    for retry_after in (30 * 86_400 + 1, 10**12, 10**30, 1e300):
        assert (await raised(executor, ToolError("E", "m", retry_after=retry_after))).retry_after == 30 * 86_400


async def test_tool_error_text_is_cut_at_the_limit(executor: ThreadPoolExecutor) -> None:
    err = await raised(executor, ToolError("E", "é" * LIMIT))
    assert err.message == "é" * (LIMIT // 2) + "…(cut)"


async def test_tool_error_whose_message_cannot_be_text_is_a_panic(
    executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="carmy.worker"):
        err = await raised(executor, ToolError("E", Unprintable()))  # type: ignore[arg-type]
    assert err.code == "TOOL_PANIC"
    assert "Traceback" in caplog.text and SECRET not in err.message
