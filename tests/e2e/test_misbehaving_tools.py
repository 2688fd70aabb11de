"""A tool's bugs never leave its caller waiting: every misbehaving tool of
``tests.toolsets.misbehaving``, called over JSON, SSE and respond-async, is answered within its
timeout (+ 1 s) by exactly one record, while its worker keeps serving, with the traceback in the
worker's log and never in the answer."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import pytest
import redis

from carmy_worker.store import keys
from carmy_worker.wire import record_decoder
from tests.sse import parse
from tests.support import Proc, Stack, wait_until
from tests.toolsets.misbehaving import MIB, SECRET, TIMEOUT

MODULE = "tests.toolsets.misbehaving"
PATIENCE = TIMEOUT + 1.0  # a caller's answer must come by then


@dataclass(frozen=True)
class Case:
    tool: str
    status: int
    code: str | None  # None: completed
    # What the worker logs about the execution: an error with a traceback, an error, or nothing.
    log: Literal["traceback", "error", "nothing"] = "traceback"
    check: Callable[[dict[str, Any]], object] = lambda body: True


def omitted(why: str) -> Callable[[dict[str, Any]], object]:
    return lambda body: why in body["error"]["details"]["omitted"] and body["error"]["message"].startswith("Refused")


def over_the_limit(body: dict[str, Any]) -> object:
    size, limit = body["error"]["details"]["size"], body["error"]["details"]["limit"]
    return limit == MIB and f"{size - limit:,} bytes over the limit of {limit:,} bytes" in body["error"]["message"]


def careful(body: dict[str, Any]) -> object:
    errors = body["data"]["errors"]
    return len(errors) == 5 and all(e.startswith(("ctx.partial:", "ctx.progress:")) for e in errors) \
        and "over the limit of 65,536 bytes" in errors[0] and "nested too deeply" in errors[1]


def odd(body: dict[str, Any]) -> object:
    return body["error"] == {"code": "NOPE", "message": "out of stock", "category": "internal",
                             "recoverable": True, "retryable": True, "retry_after": 2}


CASES = [
    # What it raises: a ToolError still reaches the caller, its unsendable details replaced by a note.
    Case("unencodable_details", 409, "NOPE", check=omitted("cannot be encoded as JSON")),
    Case("deep_details", 409, "NOPE", check=omitted("cannot be encoded as JSON")),
    Case("huge_details", 409, "NOPE", log="error", check=omitted("over the limit of 1,048,576 bytes")),
    Case("odd_tool_error", 500, "NOPE", log="nothing", check=odd),
    Case("unprintable_message", 500, "TOOL_PANIC"),
    Case("unprintable", 500, "TOOL_PANIC"),
    Case("unprintable_sync", 500, "TOOL_PANIC"),
    Case("keyboard_interrupt", 500, "TOOL_PANIC"),
    Case("generator_exit", 500, "TOOL_PANIC"),
    Case("system_exit", 500, "TOOL_PANIC"),
    Case("base_exception", 500, "TOOL_PANIC"),
    Case("exit_in_a_helper", 500, "TOOL_PANIC"),  # from a task of the tool's: it ended the worker
    Case("interrupt_in_gather", 500, "TOOL_PANIC"),
    Case("keyboard_interrupt_sync", 500, "TOOL_PANIC"),
    Case("stop_iteration_sync", 500, "TOOL_PANIC"),
    # What it returns.
    Case("deep_output", 500, "INVALID_OUTPUT"),
    Case("huge_output", 500, "INVALID_OUTPUT", log="error", check=over_the_limit),
    Case("nan_output", 500, "INVALID_OUTPUT"),
    Case("nan_anything", 200, None, log="nothing", check=lambda body: body["data"] == {"value": None}),
    Case("opaque_output", 500, "INVALID_OUTPUT"),
    Case("treacherous_output", 500, "TOOL_PANIC"),  # only the runner's last resort catches this one
    # What it reports.
    Case("bad_partial", 500, "TOOL_PANIC"),
    Case("careful_reports", 200, None, log="nothing", check=careful),
    Case("spawns_threads", 200, None, log="nothing", check=lambda body: body["data"] == {"n": 2}),
]


@pytest.fixture(scope="module")
def worker(stack: Stack) -> Proc:
    return stack.worker(MODULE)


@pytest.fixture(scope="module")
def base(stack: Stack, worker: Proc) -> Iterator[str]:
    _, url = stack.api()
    wait_until(lambda: "treacherous_output" in httpx.get(url + "/agent/tools").text)
    yield url


@pytest.fixture(scope="module")
def store(stack: Stack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(stack.redis_url)
    yield client
    client.close()


@dataclass
class Answer:
    execution_id: str
    status: int | None  # None over SSE, whose stream says 200 whatever the outcome
    body: bytes  # the result body, as the JSON answer and the record carry it


def execute(base: str, tool: str, request_id: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(base + "/agent/execute", json={"tool": tool, "request_id": request_id},
                      headers=headers, timeout=PATIENCE + 5)


def call_json(base: str, tool: str, request_id: str) -> Answer:
    r = execute(base, tool, request_id)
    return Answer(r.json()["execution_id"], r.status_code, r.content)


def call_sse(base: str, tool: str, request_id: str) -> Answer:
    r = execute(base, tool, request_id, {"accept": "text/event-stream"})
    assert r.status_code == 200
    events = parse(r.text)
    names = [name for name, _ in events]
    assert names[0] == "execution.started" and names[-1] == "execution.completed", names
    if "tool.completed" in names:  # nothing of the tool's run comes after it
        assert names.index("tool.completed") == len(names) - 2, names
    data = r.text.rstrip("\n").rsplit("data: ", 1)[1].encode()
    assert data.endswith(b',"replayed":false}')
    # The stream's status is 200 whatever the outcome: the outcome's is the record's.
    return Answer(events[-1][1]["execution_id"], None, data.removesuffix(b',"replayed":false}') + b"}")


def call_async(base: str, tool: str, request_id: str) -> Answer:
    r = execute(base, tool, request_id, {"prefer": "respond-async"})
    assert r.status_code == 202
    exec_id = r.json()["execution_id"]
    deadline = time.monotonic() + PATIENCE + 5
    while (r := httpx.get(f"{base}/agent/executions/{exec_id}")).status_code == 202:
        assert time.monotonic() < deadline, "still running"
        time.sleep(0.02)
    return Answer(exec_id, r.status_code, r.content)


CALLS = {"json": call_json, "sse": call_sse, "async": call_async}


def log_lines(worker: Proc) -> list[dict[str, Any]]:
    return [json.loads(line) for line in worker.output().splitlines() if line.startswith("{")]


def lines_about(worker: Proc, exec_id: str) -> list[dict[str, Any]]:
    return [line for line in log_lines(worker) if exec_id in line["message"]]


@pytest.mark.parametrize("mode", CALLS)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.tool)
def test_misbehaving_tool_is_answered_once_and_the_worker_goes_on(
    base: str, worker: Proc, store: redis.Redis, case: Case, mode: str,
) -> None:
    request_id = f"{case.tool}-{mode}-{uuid.uuid4()}"
    start = time.monotonic()
    answer = CALLS[mode](base, case.tool, request_id)
    elapsed = time.monotonic() - start
    assert elapsed < PATIENCE, f"answered after {elapsed:.2f} s: nothing settled it in time"

    # Exactly one record, and it is what the caller got: a retry replays it, byte for byte.
    raw = store.get(keys.record(answer.execution_id))
    assert raw is not None
    record = record_decoder.decode(raw)
    assert record.body == answer.body
    assert answer.status in (None, record.status_code)
    replay = execute(base, case.tool, request_id)
    assert (replay.status_code, replay.content) == (record.status_code, answer.body)

    body = json.loads(answer.body)
    assert record.status_code == case.status, body
    assert (body.get("error") or {}).get("code") == case.code
    assert case.check(body), body
    assert SECRET not in answer.body.decode() and "Traceback" not in answer.body.decode()

    # The worker serves on.
    ok = execute(base, "ok", str(uuid.uuid4()))
    assert (ok.status_code, ok.json().get("data")) == (200, {"n": 1})
    assert worker.alive()

    # The operator has the story: an error naming the execution, with the traceback if something raised.
    if case.log == "nothing":
        return
    errors = wait_until(lambda: [line for line in lines_about(worker, answer.execution_id)
                                 if line["level"] == "error"], what="an error logged about the execution")
    if case.log == "traceback":
        assert any(line.get("exc", "").startswith("Traceback") for line in errors), errors  # type: ignore[union-attr]


def test_nothing_reached_arq_or_asyncio_as_an_exception(worker: Proc) -> None:
    """No job raised out of the runtime, no event-loop callback failed."""
    text = worker.output()
    assert "Exception in callback" not in text
    assert '"logger": "arq' not in text and '"logger": "asyncio"' not in text


def test_a_crash_of_a_thread_the_tool_left_behind_is_logged(base: str, worker: Proc) -> None:
    r = execute(base, "spawns_threads", str(uuid.uuid4()))
    assert r.status_code == 200
    wait_until(lambda: [line for line in log_lines(worker) if line["message"].startswith("uncaught exception in thread")
                        and SECRET in line["exc"]], what="the thread's crash in the log")
    assert "Exception in thread" not in worker.output()  # Python's bare text, outside the log's format
