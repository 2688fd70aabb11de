"""Prefer: respond-async, then polling, events and DELETE on /agent/executions/{id}."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest
import redis

from api.settings import ApiKey, ApiSettings
from carmy_worker.store import jobs
from tests.sse import parse
from tests.support import Stack, app_settings, wait_until_async

ASYNC = {"prefer": "respond-async"}
ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789ab"
AS_ALICE = {"authorization": f"Bearer {ALICE}"}
AS_BOB = {"authorization": f"Bearer {BOB}"}


@pytest.fixture(scope="module")
def worker_env() -> dict[str, str]:
    return {"CARMY_CONCURRENCY": "1"}  # one at a time: the next call stays queued


@pytest.fixture(scope="module")
def api_settings(stack: Stack) -> ApiSettings:
    """Two principals: an execution is visible to its owner only."""
    keys = {ALICE: ApiKey(principal="alice"), BOB: ApiKey(principal="bob")}
    return app_settings(stack.redis_url, api_keys=keys)


async def start(client: httpx.AsyncClient, body: dict[str, object], headers: dict[str, str] = AS_ALICE
                ) -> httpx.Response:
    return await client.post("/agent/execute", json=body, headers={**ASYNC, **headers})


def linger(seconds: float, tag: str) -> dict[str, object]:
    return {"tool": "linger", "arguments": {"seconds": seconds, "tag": tag}}


async def wait_for_status(client: httpx.AsyncClient, location: str, status: str, timeout: float = 30
                          ) -> httpx.Response:
    """Polls the execution until it is in ``status`` or finished (a 202 no longer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = await client.get(location, headers=AS_ALICE)
        if r.status_code != 202 or r.json()["status"] == status:
            return r
        await asyncio.sleep(0.05)
    raise AssertionError(f"not {status} after {timeout} s")


async def test_discovery_lists_async(client: httpx.AsyncClient) -> None:
    capabilities = (await client.get("/.well-known/agent")).json()["capabilities"]
    assert capabilities[:4] == ["tools", "streaming", "idempotency", "async"]


@pytest.mark.slow
async def test_full_cycle(client: httpx.AsyncClient, stack: Stack) -> None:
    r = await start(client, linger(2, "cycle"))  # long enough for a poll to see it running
    assert r.status_code == 202
    body = r.json()
    exec_id = body["execution_id"]
    assert body == {"execution_id": exec_id, "status": "queued"} or body["status"] == "running"
    assert r.headers["location"] == f"/agent/executions/{exec_id}"
    running = await wait_for_status(client, r.headers["location"], "running")
    assert running.status_code == 202
    assert running.json() == {"execution_id": exec_id, "status": "running"}
    assert running.headers["retry-after"] == "1"
    done = await wait_for_status(client, r.headers["location"], "done")
    assert done.status_code == 200
    assert done.headers["cache-control"] == "no-store"
    assert done.json() == {"execution_id": exec_id, "status": "completed", "data": {},
                           "_agent": {"cacheable": True, "next_actions": []}}


async def test_finished_result_is_what_a_synchronous_call_gets(client: httpx.AsyncClient) -> None:
    r = await start(client, {"tool": "refuse"})
    done = await wait_for_status(client, r.headers["location"], "done")
    sync = await client.post("/agent/execute", json={"tool": "refuse"}, headers=AS_ALICE)
    assert done.status_code == sync.status_code == 409
    assert done.headers["retry-after"] == sync.headers["retry-after"] == "7"
    assert {**done.json(), "execution_id": ""} == {**sync.json(), "execution_id": ""}
    assert done.json()["_agent"]["next_actions"] == [
        {"action": "retry", "tool": "refuse", "same_request_id": False, "after_ms": 7000}]


@pytest.mark.slow
async def test_request_id_retry_returns_the_same_execution(client: httpx.AsyncClient, stack: Stack) -> None:
    # Long enough that the retry surely finds it unfinished.
    body = {"tool": "tally", "arguments": {"name": "async-retry", "seconds": 1}, "request_id": str(uuid.uuid4())}
    first = await start(client, body)
    second = await start(client, body)
    assert second.status_code == 202
    assert second.json()["execution_id"] == first.json()["execution_id"]
    await wait_for_status(client, first.headers["location"], "done")
    third = await start(client, body)  # finished: answered with the result itself
    assert third.status_code == 200
    assert third.json()["execution_id"] == first.json()["execution_id"]
    assert (stack.tmp / "tally-async-retry").read_text().count("\n") == 1


@pytest.mark.slow
async def test_events_attached_before_and_after_the_end(client: httpx.AsyncClient) -> None:
    # Long enough that the first events request surely attaches before the end.
    r = await start(client, {"tool": "tally", "arguments": {"name": "async-events", "seconds": 1}})
    exec_id = r.json()["execution_id"]
    live = parse((await client.get(f"/agent/executions/{exec_id}/events", headers=AS_ALICE)).text)
    assert live[0] == ("execution.started", {"execution_id": exec_id, "tool": "tally"})
    assert live[-1][0] == "execution.completed"
    assert live[-1][1]["replayed"] is False and live[-1][1]["status"] == "completed"
    after = await client.get(f"/agent/executions/{exec_id}/events", headers=AS_ALICE)
    assert after.headers["content-type"].startswith("text/event-stream")
    events = parse(after.text)
    assert [n for n, _ in events] == ["execution.started", "execution.completed"]
    assert events[1][1] == {**live[-1][1], "replayed": True}


async def test_a_head_of_the_events_of_a_running_execution_is_answered_at_once(client: httpx.AsyncClient) -> None:
    """HEAD is GET's head: the stream's, not held until the execution ends (it was, as a GET is)."""
    r = await start(client, linger(20, "async-head"))
    await wait_for_status(client, r.headers["location"], "running")
    head = await client.head(r.headers["location"] + "/events", headers=AS_ALICE)
    assert head.status_code == 200
    assert head.headers["content-type"].startswith("text/event-stream") and head.content == b""
    assert (await client.get(r.headers["location"], headers=AS_ALICE)).json()["status"] == "running"
    await client.delete(r.headers["location"], headers=AS_ALICE)
    unknown = await client.head("/agent/executions/exec_00000000-0000-4000-8000-000000000000/events", headers=AS_ALICE)
    assert unknown.status_code == 404


async def test_delete_a_running_execution(client: httpx.AsyncClient, stack: Stack) -> None:
    r = await start(client, linger(20, "async-del"))
    await wait_for_status(client, r.headers["location"], "running")
    # "running" is from the worker's claim: the test is of a tool that has begun.
    await wait_until_async(lambda: (stack.tmp / "linger-start-async-del").exists(), what="the tool began")
    deleted = await client.delete(r.headers["location"], headers=AS_ALICE)
    assert deleted.status_code == 408
    assert deleted.json()["status"] == "cancelled"
    assert (stack.tmp / "linger-cancelled-async-del").exists()
    assert (await client.get(r.headers["location"], headers=AS_ALICE)).json() == deleted.json()


async def test_delete_a_queued_execution(client: httpx.AsyncClient, stack: Stack, sync_redis: redis.Redis) -> None:
    busy = await start(client, linger(20, "async-busy"))  # holds the worker's one slot until deleted below
    queued = await start(client, linger(0.1, "async-queued"))
    assert queued.json()["status"] == "queued"
    deleted = await client.delete(queued.headers["location"], headers=AS_ALICE)
    assert deleted.status_code == 408
    assert "had not started" in deleted.json()["error"]["message"]
    # It never ran: calling it again is safe, under a new request_id; polling says the same.
    retry = [{"action": "retry", "tool": "linger", "same_request_id": False}]
    assert deleted.json()["_agent"]["next_actions"] == retry
    assert (await client.get(queued.headers["location"], headers=AS_ALICE)).json()["_agent"]["next_actions"] == retry
    assert (await client.delete(busy.headers["location"], headers=AS_ALICE)).status_code == 408
    # The worker is free again: it takes the queued job (arq's job key goes when it is done
    # with it), finds the execution settled and drops it without running the tool.
    await wait_until_async(lambda: not sync_redis.exists(jobs.job_key(queued.json()['execution_id'])),
                           what="the worker dropping the deleted job")
    assert not (stack.tmp / "linger-start-async-queued").exists()


async def test_delete_a_finished_execution_returns_its_result(client: httpx.AsyncClient) -> None:
    r = await start(client, {"tool": "noop"})
    done = await wait_for_status(client, r.headers["location"], "done")
    deleted = await client.delete(r.headers["location"], headers=AS_ALICE)
    assert deleted.status_code == 200
    assert deleted.content == done.content


async def test_other_principals_and_unknown_ids_get_404(client: httpx.AsyncClient) -> None:
    r = await start(client, linger(0.3, "async-private"))
    location = r.headers["location"]
    for method, path in (("GET", location), ("GET", location + "/events"), ("DELETE", location)):
        other = await client.request(method, path, headers=AS_BOB)
        assert other.status_code == 404, (method, path)
        assert other.json()["error"]["code"] == "EXECUTION_NOT_FOUND"
    unknown = f"/agent/executions/exec_{uuid.uuid4()}"
    for path in (unknown, "/agent/executions/not-an-id", "/agent/executions/exec_%2e%2e"):
        assert (await client.get(path, headers=AS_ALICE)).status_code == 404
    assert (await client.get(location, headers={})).status_code == 401
    await wait_for_status(client, location, "done")
