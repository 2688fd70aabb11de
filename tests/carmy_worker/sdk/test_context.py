"""Context: identity, progress and partial events, cancellation."""

from __future__ import annotations

import threading
from typing import Any

import msgspec
import pytest

from carmy_worker import AgentContext, Context


class Recorder:
    """An emit callback that records each event with the thread that sent it."""

    def __init__(self) -> None:
        self.events: list[tuple[int, bytes]] = []

    def __call__(self, data: bytes) -> None:
        self.events.append((threading.get_ident(), data))

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
