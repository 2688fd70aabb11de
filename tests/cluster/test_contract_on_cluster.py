"""The carmy/1 contract on a Redis Cluster: the real ``python -m api`` and ``python -m
carmy_worker`` processes against the ``redis_cluster`` fixture (``CARMY_REDIS_CLUSTER_NODES``),
checked for what a caller sees, door by door: a JSON call, an SSE call with its progress in
order, a replay and a conflicting reuse of a request id, a cancel, admission's 503s, async
executions, MCP's ``tools/call`` and a job. The partition count is the environment's
(``tests/cluster/conftest.py``, ``PARTITIONS``): the same checks hold at any."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from carmy_worker.store.jobstore import FINISHED
from tests.cluster.conftest import PARTITIONS, ClusterStack
from tests.sse import parse
from tests.support import marked, mcp_message, wait_until

pytestmark = pytest.mark.slow

SSE = {"accept": "text/event-stream"}
ASYNC = {"prefer": "respond-async"}


def rid() -> str:
    return f"req-{uuid.uuid4()}"


@pytest.fixture(scope="module")
def base(cluster_stack: ClusterStack) -> Iterator[str]:
    cluster_stack.worker()
    _, url = cluster_stack.api()
    wait_until(lambda: "linger" in httpx.get(url + "/agent/tools").text, what="the worker's tools listed")
    yield url


def execute(base: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(base + "/agent/execute", json=body, headers=headers, timeout=30)


def tally_lines(stack: ClusterStack, name: str) -> list[str]:
    path = stack.tmp / f"tally-{name}"
    return path.read_text().splitlines() if path.exists() else []


def test_a_json_call_answers_with_its_result(base: str) -> None:
    r = execute(base, {"tool": "echo", "arguments": {"text": "on a cluster", "times": 2}})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed"
    assert r.json()["data"] == {"text": "on a clusteron a cluster"}


def test_an_sse_call_streams_its_progress_in_order(base: str) -> None:
    r = execute(base, {"tool": "progress", "arguments": {"n": 5}}, SSE)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse(r.text)
    names = [name for name, _ in events]
    assert names == ["execution.started", "tool.started", *["tool.progress"] * 6, "tool.completed",
                     "execution.completed"], names
    progress = [data for name, data in events if name == "tool.progress"]
    assert [data["message"] for data in progress[:5]] == [f"step {i}" for i in range(1, 6)]
    assert progress[5]["partial"] == {"so_far": 5}  # the partial result, after every step
    assert events[-1][1]["data"] == {"n": 5} and events[-1][1]["replayed"] is False


def test_a_replay_returns_the_same_execution_run_once(base: str, cluster_stack: ClusterStack) -> None:
    name = f"replay-{uuid.uuid4().hex[:8]}"
    body = {"tool": "tally", "arguments": {"name": name}, "request_id": rid()}
    first = execute(base, body)
    again = execute(base, body)
    assert first.status_code == again.status_code == 200
    assert again.content == first.content  # the stored answer, byte for byte
    streamed = parse(execute(base, body, SSE).text)
    assert [n for n, _ in streamed] == ["execution.started", "execution.completed"]
    assert streamed[-1][1] == {**first.json(), "replayed": True}
    assert tally_lines(cluster_stack, name) == [first.json()["execution_id"]]


def test_a_request_id_reused_for_another_call_is_a_conflict(base: str) -> None:
    request_id = rid()
    assert execute(base, {"tool": "echo", "arguments": {"text": "x"}, "request_id": request_id}).status_code == 200
    r = execute(base, {"tool": "echo", "arguments": {"text": "y"}, "request_id": request_id})
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "IDEMPOTENCY_CONFLICT"


def test_an_async_execution_is_submitted_then_polled_and_streamed(base: str) -> None:
    r = execute(base, {"tool": "progress", "arguments": {"n": 3}, "request_id": rid()}, ASYNC)
    assert r.status_code == 202, r.text
    exec_id = r.json()["execution_id"]
    polled: httpx.Response = wait_until(  # type: ignore[assignment]
        lambda: (p := httpx.get(f"{base}/agent/executions/{exec_id}")).status_code == 200 and p,
        what="the async execution completed")
    assert polled.json()["status"] == "completed" and polled.json()["data"] == {"n": 3}
    events = parse(httpx.get(f"{base}/agent/executions/{exec_id}/events", headers=SSE, timeout=30).text)
    assert events[-1][0] == "execution.completed"
    assert events[-1][1]["execution_id"] == exec_id and events[-1][1]["data"] == {"n": 3}


def test_cancel_stops_a_running_call(base: str, cluster_stack: ClusterStack) -> None:
    tag = uuid.uuid4().hex[:8]
    r = execute(base, {"tool": "linger", "arguments": {"seconds": 20, "tag": tag}, "request_id": rid()}, ASYNC)
    assert r.status_code == 202, r.text
    exec_id = r.json()["execution_id"]
    marked(cluster_stack.tmp / f"linger-start-{tag}")
    cancelled = httpx.delete(f"{base}/agent/executions/{exec_id}", timeout=30)
    assert cancelled.json()["status"] == "cancelled", cancelled.text
    # The worker heard it on its partition's cancel channel, on that channel's shard.
    marked(cluster_stack.tmp / f"linger-cancelled-{tag}", timeout=5)
    assert httpx.get(f"{base}/agent/executions/{exec_id}").json()["status"] == "cancelled"


def test_mcp_tools_call_runs_the_tool(base: str) -> None:
    r = httpx.post(base + "/mcp", timeout=30, json={
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "mcp"}, "_meta": {"carmy/request_id": rid()}}},
        headers={"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"})
    assert r.status_code == 200, r.text
    message = mcp_message(r)
    assert message["result"]["isError"] is False, message
    assert message["result"]["structuredContent"] == {"text": "mcp"}


def test_a_job_runs_once_and_keeps_its_result(base: str, cluster_stack: ClusterStack) -> None:
    name = f"job-{uuid.uuid4().hex[:8]}"
    r = httpx.post(base + "/agent/jobs", json={"tool": "tally", "arguments": {"name": name}, "request_id": rid()})
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    job: dict[str, Any] = wait_until(  # type: ignore[assignment]
        lambda: (j := httpx.get(f"{base}/agent/jobs/{job_id}").json())["status"] in FINISHED and j,
        what="the job finished")
    assert job["status"] == "succeeded" and len(job["executions"]) == 1, job
    assert tally_lines(cluster_stack, name) == job["executions"]
    result = httpx.get(f"{base}/agent/executions/{job['executions'][0]}").json()
    assert result["status"] == "completed" and result["data"] == {"n": 1}


async def burst(base: str, body: dict[str, Any], n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=100)) as client:
        return await asyncio.gather(*(client.post(base + "/agent/execute", json=body) for _ in range(n)))


def test_a_full_store_answers_503_queue_full(base: str, cluster_stack: ClusterStack) -> None:
    limit = 2
    _, small = cluster_stack.api({"CARMY_MAX_PENDING": str(limit)})
    wait_until(lambda: "linger" in httpx.get(small + "/agent/tools").text)
    responses = asyncio.run(burst(small, {"tool": "linger", "arguments": {"seconds": 3}}, 10))
    accepted = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 503]
    # Admission is per partition (ceil(M/N) each): M at least, M+N-1 at most over N partitions.
    assert limit <= len(accepted) <= limit + PARTITIONS - 1 and len(accepted) + len(refused) == 10
    for r in refused:
        assert r.json()["error"]["code"] == "QUEUE_FULL" and r.headers["retry-after"] == "1"


def live_workers(base: str) -> int:
    return int(httpx.get(base + "/ready").json()["checks"]["workers"]["live"])


def test_a_group_with_no_live_worker_answers_503_no_workers(base: str, cluster_stack: ClusterStack) -> None:
    """A worker of another toolset (a group of its own) killed: its tools are refused at once."""
    wait_until(lambda: live_workers(base) == 1, what="the module's worker alone")
    other = cluster_stack.worker("tests.toolsets.extra")
    wait_until(lambda: "ping" in httpx.get(base + "/agent/tools").text, what="the other group's tools listed")
    assert execute(base, {"tool": "ping"}).status_code == 200
    other.kill()
    wait_until(lambda: live_workers(base) == 1, 15, what="the killed worker counted dead")
    started = time.monotonic()
    r = execute(base, {"tool": "ping"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "NO_WORKERS"
    assert time.monotonic() - started < 2  # at once, not after the queue timeout
    assert execute(base, {"tool": "noop"}).status_code == 200  # the other group is served still


def test_the_health_check_finds_the_worker_on_this_host(base: str, cluster_stack: ClusterStack) -> None:
    """``python -m carmy_worker.health`` reads the roster with the synchronous cluster client."""
    done = subprocess.run([sys.executable, "-m", "carmy_worker.health"], env=cluster_stack.env(),
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
