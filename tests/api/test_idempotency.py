"""request_id: replay, join, conflict, and what is (not) recorded. Side effects are counted in
files written by the tools, outside Redis."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest
import redis

from api.settings import ApiKey
from tests.conftest import app_client
from tests.sse import parse
from tests.support import Stack, app_settings, wait_until_async

SSE = {"accept": "text/event-stream"}
# The module's worker for every test, those with an app of their own too: a test run first in
# its process (alone, or so under -n 4) found none up.
pytestmark = pytest.mark.usefixtures("worker")
ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789ab"


def lines(stack: Stack, name: str) -> int:
    path: Path = stack.tmp / f"tally-{name}"
    return len(path.read_text().splitlines()) if path.exists() else 0


def rid() -> str:
    return f"req-{uuid.uuid4()}"


async def test_replay_is_byte_identical(client: httpx.AsyncClient, stack: Stack) -> None:
    request_id = rid()
    body = {"tool": "tally", "arguments": {"name": "replay"}, "request_id": request_id}
    first = await client.post("/agent/execute", json=body)
    second = await client.post("/agent/execute", json=body)
    assert first.status_code == second.status_code == 200
    assert second.content == first.content
    assert second.headers["cache-control"] == "no-store"
    assert lines(stack, "replay") == 1


async def test_replay_keeps_the_original_status(client: httpx.AsyncClient) -> None:
    body = {"tool": "refuse", "request_id": rid()}
    first = await client.post("/agent/execute", json=body)
    second = await client.post("/agent/execute", json=body)
    assert first.status_code == second.status_code == 409
    assert second.content == first.content
    assert second.headers["retry-after"] == "7"


async def test_sse_replay_sends_two_events(client: httpx.AsyncClient, stack: Stack) -> None:
    body = {"tool": "tally", "arguments": {"name": "sse-replay"}, "request_id": rid()}
    first = parse((await client.post("/agent/execute", json=body, headers=SSE)).text)
    assert first[-1][1]["replayed"] is False
    again = await client.post("/agent/execute", json=body, headers=SSE)
    events = parse(again.text)
    assert [n for n, _ in events] == ["execution.started", "execution.completed"]
    exec_id = first[0][1]["execution_id"]
    assert events[0][1] == {"execution_id": exec_id, "tool": "tally"}
    assert events[1][1] == {**first[-1][1], "replayed": True}
    json_replay = await client.post("/agent/execute", json=body)
    assert {**json_replay.json(), "replayed": True} == events[1][1]
    assert lines(stack, "sse-replay") == 1


async def test_fingerprint_ignores_key_order_and_white_space(client: httpx.AsyncClient) -> None:
    request_id = rid()
    json = {"content-type": "application/json"}
    a = await client.post("/agent/execute", headers=json, content=(
        '{"tool":"echo","arguments":{"text":"x","times":2},"request_id":"' + request_id + '"}'))
    b = await client.post("/agent/execute", headers=json, content=(
        '{ "request_id" : "' + request_id + '", "arguments" : { "times" : 2 , "text" : "x" } , "tool" : "echo" }'))
    assert a.status_code == 200
    assert b.content == a.content


async def test_a_repeated_name_counts_once_with_its_last_value(client: httpx.AsyncClient) -> None:
    # protocol.md, section 4: the tool's input, the answer and the fingerprint all see "b".
    request_id = rid()
    json = {"content-type": "application/json"}
    a = await client.post("/agent/execute", headers=json, content=(
        '{"tool":"echo","arguments":{"text":"a","text":"b"},"request_id":"' + request_id + '"}'))
    assert a.status_code == 200 and a.json()["data"] == {"text": "b"}
    b = await client.post("/agent/execute", json={"tool": "echo", "arguments": {"text": "b"}, "request_id": request_id})
    assert b.content == a.content
    c = await client.post("/agent/execute", json={"tool": "echo", "arguments": {"text": "a"}, "request_id": request_id})
    assert c.json()["error"]["code"] == "IDEMPOTENCY_CONFLICT"


@pytest.mark.parametrize("other", [
    {"tool": "echo", "arguments": {"text": "y"}},
    {"tool": "echo_sync", "arguments": {"text": "x"}},
])
async def test_conflict(client: httpx.AsyncClient, other: dict[str, object]) -> None:
    request_id = rid()
    first = await client.post("/agent/execute", json={"tool": "echo", "arguments": {"text": "x"},
                                                      "request_id": request_id})
    r = await client.post("/agent/execute", json={**other, "request_id": request_id})
    assert r.status_code == 409
    body = r.json()
    assert body["status"] == "failed"
    assert body["error"]["code"] == "IDEMPOTENCY_CONFLICT"
    assert body["error"]["category"] == "conflict"
    assert body["execution_id"] != first.json()["execution_id"]


async def test_fifty_simultaneous_duplicates_run_once(client: httpx.AsyncClient, stack: Stack) -> None:
    body = {"tool": "tally", "arguments": {"name": "fifty", "seconds": 0.3}, "request_id": rid()}
    responses = await asyncio.gather(*(client.post("/agent/execute", json=body) for _ in range(50)))
    # Fifty at once wait for the API's Redis connections; none is refused while Redis answers.
    assert {r.status_code for r in responses} == {200}, [r.text for r in responses if r.status_code != 200]
    assert len({r.content for r in responses}) == 1
    assert lines(stack, "fifty") == 1


@pytest.mark.slow
async def test_retry_joins_a_running_execution_over_sse(client: httpx.AsyncClient, stack: Stack) -> None:
    body = {"tool": "tally", "arguments": {"name": "join", "seconds": 1}, "request_id": rid()}
    first = asyncio.create_task(client.post("/agent/execute", json=body))
    await wait_until_async(lambda: lines(stack, "join") == 1, what="the first call's tool running")
    assert not first.done()  # the retry below joins a running execution, not a finished one
    joined = parse((await client.post("/agent/execute", json=body, headers=SSE)).text)
    original = (await first).json()
    assert joined[0][1]["execution_id"] == original["execution_id"]
    assert joined[-1][0] == "execution.completed"
    assert joined[-1][1] == {**original, "replayed": True}
    assert lines(stack, "join") == 1


async def test_rejected_calls_record_nothing(client: httpx.AsyncClient, stack: Stack) -> None:
    request_id = rid()
    bad = await client.post("/agent/execute", json={"tool": "tally", "arguments": {"name": 5},
                                                    "request_id": request_id})
    assert bad.status_code == 400
    refused = await client.post("/agent/execute", json={"tool": "wipe", "request_id": request_id})
    assert refused.status_code == 403
    missing = await client.post("/agent/execute", json={"tool": "nope", "request_id": request_id})
    assert missing.status_code == 404
    good = await client.post("/agent/execute", json={"tool": "tally", "arguments": {"name": "corrected"},
                                                     "request_id": request_id})
    assert good.status_code == 200
    assert lines(stack, "corrected") == 1


async def test_no_raw_request_id_in_key_names(client: httpx.AsyncClient, sync_redis: redis.Redis) -> None:
    request_id = f"RAW-ID-{uuid.uuid4().hex}"
    r = await client.post("/agent/execute", json={"tool": "noop", "request_id": request_id})
    assert r.status_code == 200
    names = [k.decode() for k in sync_redis.scan_iter(count=1000)]
    assert any(":idem:" in n for n in names)
    assert not [n for n in names if request_id in n or "RAW-ID" in n]


@pytest.mark.slow
async def test_records_expire_after_retention(stack: Stack, sync_redis: redis.Redis) -> None:
    async with app_client(app_settings(stack.redis_url, retention=1)) as c:
        body = {"tool": "tally", "arguments": {"name": "expiry"}, "request_id": rid()}
        first = await c.post("/agent/execute", json=body)
        kept_1s = [k for k in sync_redis.scan_iter("carmy:*:idem:*") if 0 <= sync_redis.ttl(k) <= 1]
        assert kept_1s
        await wait_until_async(lambda: not sync_redis.exists(*kept_1s), what="the idempotency record expiring")
        second = await c.post("/agent/execute", json=body)
        assert second.status_code == 200
        assert second.json()["execution_id"] != first.json()["execution_id"]
    assert lines(stack, "expiry") == 2


async def test_principals_are_isolated(stack: Stack) -> None:
    keys = {ALICE: ApiKey(principal="alice"), BOB: ApiKey(principal="bob", permissions=frozenset({"confirm:wipe"}))}
    async with app_client(app_settings(stack.redis_url, api_keys=keys)) as c:
        body = {"tool": "tally", "arguments": {"name": "principals"}, "request_id": "shared-id"}
        a = await c.post("/agent/execute", json=body, headers={"authorization": f"Bearer {ALICE}"})
        b = await c.post("/agent/execute", json=body, headers={"authorization": f"Bearer {BOB}"})
        assert a.status_code == b.status_code == 200
        assert a.json()["execution_id"] != b.json()["execution_id"]
        assert lines(stack, "principals") == 2
        # Each one's retry replays its own execution.
        again = await c.post("/agent/execute", json=body, headers={"authorization": f"Bearer {ALICE}"})
        assert again.content == a.content
        # Permissions come from the key.
        wipe_a = await c.post("/agent/execute", json={"tool": "wipe"}, headers={"authorization": f"Bearer {ALICE}"})
        wipe_b = await c.post("/agent/execute", json={"tool": "wipe"}, headers={"authorization": f"Bearer {BOB}"})
        assert (wipe_a.status_code, wipe_b.status_code) == (403, 200)
        who = await c.post("/agent/execute", json={"tool": "whoami"}, headers={"authorization": f"Bearer {BOB}"})
        assert who.json()["data"]["principal"] == "bob"


async def test_api_keys_guard_everything_but_discovery(stack: Stack) -> None:
    keys = {ALICE: ApiKey(principal="alice")}
    async with app_client(app_settings(stack.redis_url, api_keys=keys)) as c:
        assert (await c.get("/.well-known/agent")).status_code == 200
        for headers in ({}, {"authorization": "Bearer wrong-token-000000000"}, {"authorization": ALICE},
                        {"authorization": f"Basic {ALICE}"}):
            tools = await c.get("/agent/tools", headers=headers)
            assert tools.status_code == 401
            r = await c.post("/agent/execute", json={"tool": "noop"}, headers=headers)
            assert r.status_code == 401
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["code"] == "UNAUTHENTICATED"
            assert r.json()["error"]["category"] == "permission"
        assert (await c.get("/agent/tools", headers={"authorization": f"Bearer {ALICE}"})).status_code == 200
        assert (await c.post("/agent/execute", json={"tool": "noop"},
                             headers={"authorization": f"bearer {ALICE}"})).status_code == 200
