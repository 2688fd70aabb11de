"""Tasks (SEP-2663, extension ``io.modelcontextprotocol/tasks``) driven by
``@modelcontextprotocol/ext-tasks`` 0.2.2 on a ``@modelcontextprotocol/client`` 2.4.0 client
(2026-07-28), as an agent that declares the extension uses them: a call that may outlive its
patience becomes a task built on Carmy's execution (taskId = execution id), polled with
tasks/get and cancelled with tasks/cancel; a quick tool answers inline.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.interop.conftest import Agent, running
from tests.support import Stack, marked, wait_until

TASKS = "io.modelcontextprotocol/tasks"


@pytest.fixture(scope="module")
def agent(node: str, stack: Stack) -> Iterator[Agent]:
    with running(node, "client_v2", stack) as a:
        yield a


def test_server_advertises_tasks(agent: Agent, url: str) -> None:
    answer = agent.run("connect", url)
    assert answer["protocolVersion"] == "2026-07-28"
    assert answer["discover"]["capabilities"]["extensions"][TASKS] == {}


def test_quick_tool_answers_inline(agent: Agent, url: str) -> None:
    answer = agent.run("task", url, call={"name": "echo", "arguments": {"text": "ab"}})
    assert answer["capabilities"]["execution"] is True  # ext-tasks found the extension
    assert answer["kind"] == "immediate"
    assert answer["outcome"]["status"] == "completed"
    assert answer["outcome"]["result"]["structuredContent"] == {"text": "ab"}
    assert answer["errors"] == []


def test_long_tool_runs_as_a_task(agent: Agent, url: str, stack: Stack) -> None:
    """A call still going after CARMY_MCP_TASK_AFTER (the gate stays shut until the task exists)
    becomes a task whose id is the execution's, polled to the call's result."""
    tag = "interop-task"
    command = agent.start("task", url, call={"name": "gate", "arguments": {"tag": tag}})
    event = agent.next(command)
    assert (event.get("event"), event.get("status")) == ("task", "working"), event
    task_id = event["taskId"]
    assert task_id.startswith("exec_")
    assert marked(stack.tmp / f"gate-start-{tag}").split() == [task_id]  # the tool runs as that execution
    (stack.tmp / f"gate-open-{tag}").touch()
    answer = agent.answer(command)
    assert answer["kind"] == "task"
    outcome = answer["outcome"]
    assert outcome["status"] == "completed"
    result = outcome["result"]
    assert result["isError"] is False
    assert result["structuredContent"] == {"n": 1}
    assert result["_meta"]["carmy/execution_id"] == task_id
    assert answer["errors"] == []


def test_cancel_a_task(agent: Agent, url: str, stack: Stack) -> None:
    """tasks/get says it is working, tasks/update is acknowledged, and tasks/cancel cancels the
    running tool (else it runs 300 s)."""
    tag = "interop-task-cancel"
    command = agent.start("task", url, cancel=True, call={"name": "hold", "arguments": {"seconds": 300, "tag": tag}})
    event = agent.next(command)
    assert (event.get("event"), event.get("status")) == ("task", "working"), event
    wait_until(lambda: (stack.tmp / f"hold-start-{tag}").exists(), 30, what="the tool started")
    agent.send({"id": command, "cancel": True})
    assert marked(stack.tmp / f"hold-cancelled-{tag}", 10).split() == [event["taskId"]]
    answer = agent.answer(command)
    assert answer["update"] == "ok"
    assert answer["outcome"]["status"] == "cancelled"
    assert answer["errors"] == []
