"""Server-Sent Events: order, payloads, progress, and short streams for refused calls."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.conftest import app_client
from tests.sse import parse
from tests.support import Proc, Stack, app_settings

SSE = {"accept": "text/event-stream"}


@pytest.mark.parametrize("tool", ["progress", "progress_sync"])
async def test_event_order_and_payloads(client: httpx.AsyncClient, tool: str) -> None:
    r = await client.post("/agent/execute", json={"tool": tool, "arguments": {"n": 3}}, headers=SSE)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-store"
    events = parse(r.text)
    names = [n for n, _ in events]
    expected_progress = 4 if tool == "progress" else 3  # the async one also sends a partial
    assert names == ["execution.started", "tool.started", *["tool.progress"] * expected_progress,
                     "tool.completed", "execution.completed"]
    exec_id = events[0][1]["execution_id"]
    assert events[0][1] == {"execution_id": exec_id, "tool": tool}
    assert events[1][1] == {"execution_id": exec_id, "tool": tool}
    progress = [d for n, d in events if n == "tool.progress"]
    assert progress[:3] == [
        {"execution_id": exec_id, "tool": tool, "progress": i, "total": 3, **({"message": f"step {i}"}
                                                                            if tool == "progress" else {})}
        for i in (1, 2, 3)
    ]
    if tool == "progress":
        assert progress[3] == {"execution_id": exec_id, "tool": tool, "progress": 3, "partial": {"so_far": 3}}
    done = events[-2][1]
    assert set(done) == {"execution_id", "tool", "duration_ms", "ok"}
    assert done["ok"] is True and isinstance(done["duration_ms"], int)
    final = events[-1][1]
    assert final == {"execution_id": exec_id, "status": "completed", "data": {"n": 3},
                     "_agent": {"cacheable": True, "next_actions": []}, "replayed": False}


@pytest.mark.parametrize("accept", ["application/json, text/event-stream", "Text/Event-Stream"])
async def test_any_accept_that_names_the_stream_gets_it(client: httpx.AsyncClient, accept: str) -> None:
    r = await client.post("/agent/execute", json={"tool": "noop"}, headers={"accept": accept})
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert [n for n, _ in parse(r.text)] == ["execution.started", "tool.started", "tool.completed",
                                             "execution.completed"]


async def test_failure_over_sse(client: httpx.AsyncClient) -> None:
    r = await client.post("/agent/execute", json={"tool": "refuse"}, headers=SSE)
    events = parse(r.text)
    assert [n for n, _ in events] == ["execution.started", "tool.started", "tool.completed", "execution.completed"]
    assert events[2][1]["ok"] is False
    assert events[-1][1]["error"]["code"] == "OUT_OF_STOCK"
    assert events[-1][1]["status"] == "failed"


@pytest.mark.parametrize(("body", "code"), [
    ({"tool": "missing"}, "TOOL_NOT_FOUND"),
    ({"tool": "wipe"}, "CONFIRMATION_REQUIRED"),
    ({"tool": "echo", "arguments": {}}, "INVALID_ARGUMENTS"),
    ({"tool": "noop", "request_id": ""}, "INVALID_ID"),
])
async def test_refused_calls_send_two_events(client: httpx.AsyncClient, body: dict[str, object], code: str) -> None:
    r = await client.post("/agent/execute", json=body, headers=SSE)
    assert r.status_code == 200
    events = parse(r.text)
    assert [n for n, _ in events] == ["execution.started", "execution.completed"]
    assert events[0][1]["execution_id"] == events[1][1]["execution_id"]
    assert events[1][1]["error"]["code"] == code
    assert events[1][1]["replayed"] is False


async def test_envelope_errors_are_plain_json_even_for_sse(client: httpx.AsyncClient) -> None:
    r = await client.post("/agent/execute", content=b"{", headers={**SSE, "content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "INVALID_REQUEST"


@pytest.mark.slow
async def test_keep_alive_comments_while_the_tool_is_quiet(stack: Stack, worker: Proc) -> None:
    async with app_client(app_settings(stack.redis_url, sse_keepalive=0.2)) as c:
        for _ in range(1500):  # up to 30 s for this app's catalog to see the worker, on a busy machine
            if b'"linger"' in (await c.get("/agent/tools")).content:
                break
            await asyncio.sleep(0.02)
        r = await c.post("/agent/execute", json={"tool": "linger", "arguments": {"seconds": 0.9, "tag": "ka"}},
                         headers=SSE)
    assert r.text.count(": keep-alive\n\n") >= 2
    # Comments are not events: the event sequence is unchanged, execution.completed still last.
    assert [n for n, _ in parse(r.text)] == ["execution.started", "tool.started", "tool.completed",
                                             "execution.completed"]
