"""Traces across the queue, against real processes: an API under uvicorn and a worker, each
exporting its spans to a JSON-lines file of its own (``CARMY_TRACING=file:<path>``); the test
reads both files and checks one connected trace per execution.

Request span (API) -> ``carmy.queued`` and ``carmy.run`` (worker), both children of it, in one
trace: the caller's when it sent a ``traceparent`` (header, or ``_meta.traceparent`` on MCP),
else a new one.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import sse
from tests.conftest import private_stack
from tests.support import Stack, mcp_message, wait_until

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT_RE = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
# Export each batch within 50 ms (the SDK's standard variable), so the files fill quickly.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}


class Traced:
    def __init__(self, base: str, api_spans: Path, worker_spans: Path) -> None:
        self.base, self.files = base, (api_spans, worker_spans)

    def spans(self, trace_id: str, count: int = 3) -> dict[str, dict[str, Any]]:
        """The ``count`` spans of ``trace_id`` across both processes, by name, once all are written."""
        def found() -> dict[str, dict[str, Any]] | None:
            spans = [json.loads(line) for path in self.files if path.exists()
                     for line in path.read_text().splitlines(keepends=True) if line.endswith("\n")]
            mine = [s for s in spans if s["trace_id"] == trace_id]
            return {s["name"]: s for s in mine} if len(mine) >= count else None
        spans = wait_until(found, 30, what=f"{count} spans of trace {trace_id}")
        assert isinstance(spans, dict) and len(spans) == count, spans
        return spans


@pytest.fixture(scope="module")
def traced(stack: Stack) -> Traced:
    api_spans, worker_spans = stack.tmp / "api-spans.jsonl", stack.tmp / "worker-spans.jsonl"
    stack.worker(env={"CARMY_TRACING": f"file:{worker_spans}", **FAST_EXPORT})
    _, base = stack.api(env={"CARMY_TRACING": f"file:{api_spans}", **FAST_EXPORT})
    return Traced(base, api_spans, worker_spans)


def check_trace(spans: dict[str, dict[str, Any]], request_name: str, exec_id: str) -> dict[str, Any]:
    """The request span, after checking the worker's two spans hang from it."""
    request, queued, run = spans[request_name], spans["carmy.queued"], spans["carmy.run"]
    assert request["service"] == "carmy-api" and request["kind"] == "SERVER"
    assert queued["service"] == run["service"] == "carmy-worker"
    assert queued["parent_span_id"] == run["parent_span_id"] == request["span_id"]
    assert queued["attributes"]["carmy.execution_id"] == run["attributes"]["carmy.execution_id"] == exec_id
    assert request["attributes"]["carmy.execution_id"] == exec_id
    assert run["attributes"]["carmy.outcome"] == "completed"
    # The queue's span ends at the claim, before the run; both within the request.
    assert queued["start_ns"] <= queued["end_ns"] <= run["start_ns"] <= run["end_ns"] <= request["end_ns"]
    return request


def test_incoming_traceparent_is_kept_and_carried_to_the_worker(traced: Traced) -> None:
    traceparent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    r = httpx.post(traced.base + "/agent/execute", json={"tool": "progress", "arguments": {"n": 2}},
                   headers={"traceparent": traceparent, "accept": "text/event-stream"}, timeout=30)
    events = sse.parse(r.text)
    final = events[-1][1]
    assert final["status"] == "completed"
    assert final["_agent"]["trace_id"] == CALLER_TRACE
    progress = [data for name, data in events if name == "tool.progress"]
    assert progress and all(p["trace_id"] == CALLER_TRACE for p in progress)

    spans = traced.spans(CALLER_TRACE)
    request = check_trace(spans, "POST /agent/execute", final["execution_id"])
    assert request["parent_span_id"] == CALLER_SPAN  # the caller's span is its parent
    # The answer names the request's span, for the caller to hang its own spans from.
    assert r.headers["traceparent"] == f"00-{CALLER_TRACE}-{request['span_id']}-01"


def test_without_traceparent_a_new_trace_starts(traced: Traced) -> None:
    r = httpx.post(traced.base + "/agent/execute", json={"tool": "echo", "arguments": {"text": "hi"}}, timeout=30)
    assert r.status_code == 200
    match = TRACEPARENT_RE.match(r.headers["traceparent"])
    assert match is not None, r.headers
    trace_id, span_id = match.groups()
    assert trace_id != CALLER_TRACE
    body = r.json()
    assert body["_agent"]["trace_id"] == trace_id
    request = check_trace(traced.spans(trace_id), "POST /agent/execute", body["execution_id"])
    assert request["span_id"] == span_id and "parent_span_id" not in request

    # A replay answers the record as first sent: the execution's trace, whoever asks.
    request_id = str(uuid.uuid4())
    first = httpx.post(traced.base + "/agent/execute", timeout=30,
                       json={"tool": "echo", "arguments": {"text": "again"}, "request_id": request_id})
    again = httpx.post(traced.base + "/agent/execute", timeout=30,
                       json={"tool": "echo", "arguments": {"text": "again"}, "request_id": request_id})
    assert again.json() == first.json()
    assert again.json()["_agent"]["trace_id"] == TRACEPARENT_RE.match(first.headers["traceparent"])[1]  # type: ignore[index]


def test_mcp_meta_traceparent_is_honoured(traced: Traced) -> None:
    trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {},
            "traceparent": f"00-{trace_id}-{span_id}-01"}
    r = httpx.post(traced.base + "/mcp", timeout=30, json={
        "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "a"},
                                                                        "_meta": meta}},
        headers={"accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28",
                 "mcp-method": "tools/call", "mcp-name": "echo"})
    assert r.status_code == 200, r.text
    message = mcp_message(r)
    result = message["result"]
    assert result["isError"] is False
    assert result["_meta"]["carmy/trace_id"] == trace_id
    request = check_trace(traced.spans(trace_id), "tools/call echo", result["_meta"]["carmy/execution_id"])
    assert request["parent_span_id"] == span_id


@pytest.fixture
def untraced() -> Iterator[tuple[str, Stack]]:
    # Python logs every module it imports, when it imports it, to stderr (the process's log).
    env = {"PYTHONPROFILEIMPORTTIME": "1", "OTEL_SERVICE_NAME": "x", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    with private_stack() as (_, stack):
        stack.worker(env=env)
        _, base = stack.api(env=env)
        yield base, stack


def test_off_by_default_nothing_exported_and_no_sdk_imported(untraced: tuple[str, Stack]) -> None:
    base, stack = untraced
    r = httpx.post(base + "/agent/execute", json={"tool": "progress", "arguments": {"n": 2}},
                   headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", "accept": "text/event-stream"},
                   timeout=30)
    events = sse.parse(r.text)
    assert events[-1][1]["status"] == "completed"
    assert "traceparent" not in r.headers
    assert all("trace_id" not in data and "trace_id" not in data.get("_agent", {}) for _, data in events)
    assert not list(stack.tmp.glob("*.jsonl"))
    for proc in stack.procs:
        log = proc.output()
        assert "import time:" in log  # the import log is there to be read
        assert "opentelemetry.sdk" not in log, proc.name
