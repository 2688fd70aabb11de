"""Context: identity, progress and partial events, cancellation."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import msgspec
import pytest

from carmy_worker import AgentContext, Context
from carmy_worker.wire import MAX_EVENT_BYTES


class Recorder:
    """An emit callback that records each event with the thread that sent it."""

    def __init__(self) -> None:
        self.events: list[tuple[int, bytes]] = []
        self.partial: list[bool] = []  # whether each event carries a partial result

    def __call__(self, data: bytes, partial: bool) -> None:
        self.events.append((threading.get_ident(), data))
        self.partial.append(partial)

    def decoded(self) -> list[Any]:
        return [msgspec.json.decode(data) for _, data in self.events]


def make(recorder: Recorder, agent: AgentContext | None = None) -> Context:
    return Context(execution_id="exec_1", tool="t", request_id="req-1", agent=agent or AgentContext(), emit=recorder)


def test_identity_comes_from_the_agent_context() -> None:
    agent = AgentContext(principal="alice", session="s1", permissions=frozenset({"confirm:wipe"}),
                         metadata={"team": "ops"})
    ctx = make(Recorder(), agent)
    assert (ctx.execution_id, ctx.tool, ctx.request_id) == ("exec_1", "t", "req-1")
    assert (ctx.principal, ctx.session, ctx.permissions, ctx.metadata) == (
        "alice", "s1", frozenset({"confirm:wipe"}), {"team": "ops"})
    assert ctx.cancelled is False


def test_events_from_a_thread_arrive_in_order() -> None:
    recorder = Recorder()
    ctx = make(recorder)

    def work() -> None:
        for i in range(50):
            ctx.progress(i, total=50)
        ctx.partial({"rows": [1, 2]})

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(5)
    events = recorder.decoded()
    assert [e["progress"] for e in events] == [*range(50), 49]
    assert events[-1] == {"execution_id": "exec_1", "tool": "t", "progress": 49, "partial": {"rows": [1, 2]}}
    # Delivered synchronously, in the caller's thread (so a sync tool's events precede its return).
    assert {ident for ident, _ in recorder.events} == {thread.ident}


def test_absent_fields_are_omitted() -> None:
    recorder = Recorder()
    ctx = make(recorder)
    ctx.progress(1)
    ctx.progress(2.5, total=10, message="halfway")
    assert [data for _, data in recorder.events] == [
        b'{"execution_id":"exec_1","tool":"t","progress":1}',
        b'{"execution_id":"exec_1","tool":"t","progress":2.5,"total":10,"message":"halfway"}',
    ]


def test_partial_carries_the_last_progress() -> None:
    recorder = Recorder()
    ctx = make(recorder)
    ctx.partial("first")
    ctx.progress(3, total=4, message="almost")
    ctx.partial(None)
    first, _, last = recorder.decoded()
    assert first == {"execution_id": "exec_1", "tool": "t", "progress": 0, "partial": "first"}
    # Only the progress number is carried over; a None partial is still sent.
    assert last == {"execution_id": "exec_1", "tool": "t", "progress": 3, "partial": None}


def test_events_after_cancellation_are_dropped() -> None:
    recorder = Recorder()
    ctx = make(recorder)
    ctx.progress(1)
    ctx._cancel()
    assert ctx.cancelled is True
    ctx.progress(2)
    ctx.partial("late")
    assert [e["progress"] for e in recorder.decoded()] == [1]


def test_non_json_partial_fails_in_the_tools_call() -> None:
    recorder = Recorder()
    ctx = make(recorder)
    with pytest.raises(TypeError):
        ctx.partial(object())
    assert recorder.events == []


def test_each_event_says_whether_it_carries_a_partial_result() -> None:
    recorder = Recorder()
    ctx = make(recorder)
    ctx.progress(1)
    ctx.partial([1])
    assert recorder.partial == [False, True]


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


class Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("repr")


@pytest.mark.parametrize(("value", "error", "says"), [
    (Unprintable(), TypeError, "ctx.partial: the value cannot be sent as JSON (TypeError: Encoding objects of type "
                               "Unprintable is unsupported)"),
    (nested(100_000), ValueError, "ctx.partial: the value is nested too deeply"),
    ("\ud800", ValueError, "ctx.partial: the value cannot be sent as JSON"),
    ("x" * MAX_EVENT_BYTES, ValueError, "ctx.partial: the event would be 65,"),
], ids=["unencodable", "too-deep", "not-utf-8", "too-large"])
def test_a_partial_that_cannot_be_sent_fails_in_the_tools_call(value: Any, error: type[Exception], says: str) -> None:
    recorder = Recorder()
    ctx = make(recorder)
    with pytest.raises(error) as info:
        ctx.partial(value)
    assert str(info.value).startswith(says)
    assert recorder.events == []
    ctx.partial("x" * (MAX_EVENT_BYTES - 100))  # what fits goes
    assert len(recorder.events) == 1


@pytest.mark.parametrize(("args", "error", "says"), [
    (("half",), TypeError, "ctx.progress: progress must be a number, not str"),
    ((True,), TypeError, "ctx.progress: progress must be a number, not bool"),
    ((float("nan"),), ValueError, "ctx.progress: progress must be a finite number"),
    ((1, float("inf")), ValueError, "ctx.progress: total must be a finite number"),
    ((1, 2, b"bytes"), TypeError, "ctx.progress: message must be a str"),
    ((1, 2, "m" * MAX_EVENT_BYTES), ValueError, "ctx.progress: the event would be"),
])
def test_progress_that_mcp_clients_could_not_take_fails_in_the_tools_call(
    args: tuple[Any, ...], error: type[Exception], says: str,
) -> None:
    # MCP's progress notifications carry numbers: a NaN (null in JSON) or a string would break
    # the relay of the call, far from the tool that sent it.
    recorder = Recorder()
    ctx = make(recorder)
    with pytest.raises(error, match="^" + re.escape(says)):
        ctx.progress(*args)
    ctx.partial("after")
    assert recorder.decoded() == [{"execution_id": "exec_1", "tool": "t", "progress": 0, "partial": "after"}]


async def test_holds_execution_asks_the_store_and_never_blocks_the_event_loop() -> None:
    answers: list[bool] = [True, False]

    async def holds() -> bool:
        return answers.pop(0)

    ctx = Context(execution_id="exec_1", tool="t", request_id=None, agent=AgentContext(), emit=Recorder(),
                  attempt=2, holds=holds)
    loop = asyncio.get_running_loop()
    ctx._start(loop.create_future())
    assert ctx.attempt == 2
    # From a sync tool's thread: one question to the store, answered through the event loop.
    assert await asyncio.to_thread(ctx.holds_execution_blocking) is True
    assert await ctx.holds_execution() is False
    # From the event loop itself it would wait on the loop it blocks: refused, loudly.
    with pytest.raises(RuntimeError, match="would block the event loop"):
        ctx.holds_execution_blocking()
    # Once cancelled, no question is asked: the attempt no longer acts.
    ctx._cancel()
    assert await ctx.holds_execution() is False
