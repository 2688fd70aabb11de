"""Per-principal quotas across real API processes, a real worker and Redis: the pending limit,
the rate's bucket, a limit shared by API replicas, retries never charged, and one principal at
its limit leaving another's calls alone."""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time

import httpx

from tests.support import Stack, marked, wait_until

ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789"
KEYS = json.dumps({ALICE: {"principal": "alice"}, BOB: {"principal": "bob"}})
HOLD = 3  # seconds the held calls keep their slots: longer than a burst takes to arrive


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def start(stack: Stack, env: dict[str, str], apis: int = 1) -> list[str]:
    stack.worker(env={"CARMY_CONCURRENCY": "16"})
    bases = [stack.api({"CARMY_API_KEYS": KEYS, **env})[1] for _ in range(apis)]
    for base in bases:
        wait_until(lambda base=base: "linger" in httpx.get(base + "/agent/tools", headers=auth(ALICE)).text)
    return bases


async def burst(urls: list[str], token: str, bodies: list[dict[str, object]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60, headers=auth(token), limits=httpx.Limits(max_connections=100)) as c:
        return await asyncio.gather(*(c.post(urls[i % len(urls)] + "/agent/execute", json=body)
                                      for i, body in enumerate(bodies)))


def linger(tag: str, seconds: float = HOLD, request_id: str | None = None) -> dict[str, object]:
    body: dict[str, object] = {"tool": "linger", "arguments": {"seconds": seconds, "tag": tag}}
    if request_id is not None:
        body["request_id"] = request_id
    return body


def test_over_the_pending_limit_is_429_and_the_same_request_id_runs_later(fresh_stack: Stack) -> None:
    [base] = start(fresh_stack, {"CARMY_QUOTA_PENDING": "2"})
    with httpx.Client(timeout=60) as client:
        held = [threading.Thread(target=client.post, args=(base + "/agent/execute",),
                                 kwargs={"json": linger(f"held-{i}"), "headers": auth(ALICE)}) for i in range(2)]
        for thread in held:
            thread.start()
        for i in range(2):
            marked(fresh_stack.tmp / f"linger-start-held-{i}")
        body = linger("third", 0.1, request_id="third")
        refused = client.post(base + "/agent/execute", json=body, headers=auth(ALICE))
        ran_early = (fresh_stack.tmp / "linger-start-third").exists()
        # Another principal has a quota of its own.
        assert client.post(base + "/agent/execute", json=linger("bob", 0.1), headers=auth(BOB)).status_code == 200
        for thread in held:
            thread.join(30)
        ran = client.post(base + "/agent/execute", json=body, headers=auth(ALICE))
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    err = refused.json()["error"]
    assert err["code"] == "RATE_LIMITED" and err["category"] == "capacity"
    assert err["retryable"] is True and err["retry_after"] == 1 and err["details"] == {"limit": "pending"}
    assert refused.json()["_agent"]["next_actions"] == [
        {"action": "retry", "tool": "linger", "same_request_id": True, "after_ms": 1000}]
    # Nothing was recorded for the refusal: the same request id runs now, as a new execution.
    assert not ran_early
    assert ran.status_code == 200 and ran.json()["status"] == "completed"
    assert (fresh_stack.tmp / "linger-start-third").exists()


def test_the_rate_bucket_refills(fresh_stack: Stack) -> None:
    # Two calls at once, then one every 5 s.
    [base] = start(fresh_stack, {"CARMY_QUOTA_RATE": "0.2", "CARMY_QUOTA_BURST": "2"})
    responses = asyncio.run(burst([base], ALICE, [{"tool": "noop"}] * 3))
    assert sorted(r.status_code for r in responses) == [200, 200, 429]
    [refused] = [r for r in responses if r.status_code == 429]
    err = refused.json()["error"]
    assert err["code"] == "RATE_LIMITED" and err["details"] == {"limit": "rate"}
    assert 1 <= err["retry_after"] <= 5 and refused.headers["retry-after"] == str(err["retry_after"])
    # Refusals are not charged: the bucket refills while the caller keeps asking.
    with httpx.Client(timeout=60, headers=auth(ALICE)) as client:
        def admitted() -> bool:
            r = client.post(base + "/agent/execute", json={"tool": "noop", "request_id": "later"})
            assert r.status_code in (200, 429)
            time.sleep(0.2)
            return r.status_code == 200
        wait_until(admitted, 30)


def test_a_quota_is_the_exact_principal_strings(fresh_stack: Stack) -> None:
    # As documented (README, "Per-principal quotas"): names that differ in case, spaces or
    # Unicode width are different callers to Carmy, each with its own bucket; one caller is one
    # name, and making names canonical is the issuer's call.
    spellings = {f"key-{i}-0123456789": name for i, name in enumerate(["alice", "Alice", "alice ", "\uff41lice"])}
    stack = fresh_stack
    stack.worker()
    keys = json.dumps({token: {"principal": name} for token, name in spellings.items()})
    _, base = stack.api({"CARMY_API_KEYS": keys, "CARMY_QUOTA_RATE": "0.01", "CARMY_QUOTA_BURST": "1"})
    first = next(iter(spellings))
    wait_until(lambda: "noop" in httpx.get(base + "/agent/tools", headers=auth(first)).text)
    with httpx.Client(timeout=60) as client:
        def call(token: str) -> int:
            return client.post(base + "/agent/execute", json={"tool": "noop"}, headers=auth(token)).status_code
        assert [call(token) for token in spellings] == [200] * 4  # four buckets, one call each
        assert [call(token) for token in spellings] == [429] * 4  # and each is spent


def test_two_api_processes_share_one_principal_limit(fresh_stack: Stack) -> None:
    bases = start(fresh_stack, {"CARMY_QUOTA_PENDING": "3"}, apis=2)
    responses = asyncio.run(burst(bases, ALICE, [linger(f"shared-{i}") for i in range(9)]))
    assert sorted(r.status_code for r in responses) == [200] * 3 + [429] * 6


def test_replays_and_joins_are_neither_charged_nor_refused(fresh_stack: Stack) -> None:
    # One execution at a time, and one new execution per 100 s.
    [base] = start(fresh_stack, {"CARMY_QUOTA_PENDING": "1", "CARMY_QUOTA_RATE": "0.01", "CARMY_QUOTA_BURST": "1"})
    body = linger("joined", 1.5, request_id="once")
    with httpx.Client(timeout=60, headers=auth(ALICE)) as client:
        first: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: first.append(client.post(base + "/agent/execute", json=body)))
        thread.start()
        marked(fresh_stack.tmp / "linger-start-joined")
        joined = client.post(base + "/agent/execute", json=body)  # over both limits, still answered
        thread.join(30)
        replayed = client.post(base + "/agent/execute", json=body)
        new = client.post(base + "/agent/execute", json={"tool": "noop"})
    assert first[0].status_code == joined.status_code == replayed.status_code == 200
    assert first[0].json()["execution_id"] == joined.json()["execution_id"] == replayed.json()["execution_id"]
    assert new.status_code == 429 and new.json()["error"]["details"] == {"limit": "rate"}
    assert int(new.headers["retry-after"]) > 60  # the one token went to the first call, no other


def test_one_principal_flooding_does_not_slow_another(fresh_stack: Stack) -> None:
    [base] = start(fresh_stack, {"CARMY_QUOTA_PENDING": "4"})

    def bob_calls() -> list[tuple[int, float]]:
        with httpx.Client(timeout=60, headers=auth(BOB)) as client:
            out = []
            for i in range(10):
                r = client.post(base + "/agent/execute", json={"tool": "echo", "arguments": {"text": str(i)}})
                out.append((r.status_code, r.elapsed.total_seconds()))
            return out

    quiet = bob_calls()
    stop = threading.Event()
    alice: list[int] = []

    def flood() -> None:
        with httpx.Client(timeout=60, headers=auth(ALICE)) as client:
            while not stop.is_set():
                alice.append(client.post(base + "/agent/execute", json=linger("flood", 0.5)).status_code)
                time.sleep(0.02)

    flooders = [threading.Thread(target=flood) for _ in range(8)]
    for thread in flooders:
        thread.start()
    try:
        wait_until(lambda: alice.count(429) >= 5, 30)  # alice is at her limit
        refused_before = alice.count(429)
        flooded = bob_calls()
        refused_during = alice.count(429) - refused_before
    finally:
        stop.set()
        for thread in flooders:
            thread.join(30)
    assert [status for status, _ in quiet] == [status for status, _ in flooded] == [200] * 10
    assert refused_during > 0  # alice stayed at her limit while bob called
    assert 200 in alice  # alice's own calls still ran, four at a time
    # Normal latency, with room for a busy machine: bob's calls need no free slot of alice's.
    assert statistics.median(t for _, t in flooded) <= 10 * statistics.median(t for _, t in quiet) + 1.0
