"""Admission across API processes, one-at-a-time tools across workers, and NO_WORKERS."""

from __future__ import annotations

import asyncio
import itertools
import signal
import threading
from collections import Counter

import httpx

from carmy_worker.store import keys
from tests.support import Stack, marked, wait_until

# Seconds the accepted calls of a burst hold their slots: longer than a whole burst takes to
# arrive, even on a busy machine (a slot freed mid-burst would admit a fifth call).
HOLD = 3


async def burst(urls: list[str], body: dict[str, object], n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=200)) as client:
        return await asyncio.gather(*(client.post(urls[i % len(urls)] + "/agent/execute", json=body)
                                      for i in range(n)))


def admitted_within_shares(responses: list[httpx.Response], max_pending: int) -> None:
    """A burst over ``max_pending``: each call accepted or refused, and each
    partition admitting at most its share, ⌈max_pending/N⌉ (docs/architecture.md, "Admission
    across partitions"). With one partition that is exactly ``max_pending``; with several, the
    calls land in partitions at random, and the burst fills only those it reached."""
    accepted = [r for r in responses if r.status_code == 200]
    assert len(accepted) + sum(r.status_code == 503 for r in responses) == len(responses)
    by_partition = Counter(keys.partition_of(r.json()["execution_id"]) for r in accepted)
    assert accepted and max(by_partition.values()) <= keys.share(max_pending)
    if keys.partition_count() == 1:
        assert len(accepted) == max_pending


def test_burst_over_max_pending_gets_503_then_capacity_returns(fresh_stack: Stack) -> None:
    fresh_stack.worker(env={"CARMY_CONCURRENCY": "8"})
    _, base = fresh_stack.api({"CARMY_MAX_PENDING": "4"})
    wait_until(lambda: "linger" in httpx.get(base + "/agent/tools").text)
    body = {"tool": "linger", "arguments": {"seconds": HOLD}}
    responses = asyncio.run(burst([base], body, 12))
    admitted_within_shares(responses, 4)
    refused = [r for r in responses if r.status_code == 503]
    for r in refused:
        assert r.headers["retry-after"] == "1"
        error = r.json()["error"]
        assert error["code"] == "QUEUE_FULL"
        assert error["retryable"] is True and error["retry_after"] == 1
        # Nothing was recorded: the very same call, after retry_after.
        assert r.json()["_agent"]["next_actions"] == [
            {"action": "retry", "tool": "linger", "same_request_id": True, "after_ms": 1000}]
    # Every accepted call completed, and the slots came back: all four at once with one
    # partition; with several (a partition's share may be one), one call after another.
    short = {"tool": "linger", "arguments": {"seconds": 0.5}}
    if keys.partition_count() == 1:
        again = asyncio.run(burst([base], short, 4))
    else:
        again = [httpx.post(base + "/agent/execute", json=short, timeout=30) for _ in range(4)]
    assert [r.status_code for r in again] == [200] * 4


def test_two_api_processes_share_one_limit(fresh_stack: Stack) -> None:
    fresh_stack.worker(env={"CARMY_CONCURRENCY": "8"})
    _, a = fresh_stack.api({"CARMY_MAX_PENDING": "4"})
    _, b = fresh_stack.api({"CARMY_MAX_PENDING": "4"})
    for url in (a, b):
        wait_until(lambda url=url: "linger" in httpx.get(url + "/agent/tools").text)
    responses = asyncio.run(burst([a, b], {"tool": "linger", "arguments": {"seconds": HOLD}}, 12))
    admitted_within_shares(responses, 4)


def test_not_parallel_safe_tool_never_overlaps_across_workers(fresh_stack: Stack) -> None:
    # Four slots each for eight calls: both workers must take some, however the lease race goes.
    fresh_stack.worker(env={"CARMY_CONCURRENCY": "4"})
    fresh_stack.worker(env={"CARMY_CONCURRENCY": "4"})
    _, base = fresh_stack.api()
    wait_until(lambda: "exclusive" in httpx.get(base + "/agent/tools").text)
    responses = asyncio.run(burst([base], {"tool": "exclusive", "arguments": {"seconds": 0.15}}, 8))
    assert [r.status_code for r in responses] == [200] * 8
    spans = sorted(tuple(map(float, line.split())) for line in
                   (fresh_stack.tmp / "exclusive").read_text().splitlines())
    assert len(spans) == 8
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, "two executions of a parallel_safe=False tool overlapped"
    # Both workers took part (the lock is across processes, not within one).
    logs = [p.output() for p in fresh_stack.procs[:2]]
    assert all('"tool": "exclusive"' in log for log in logs)


def test_no_workers_at_once_after_the_last_worker_dies(fresh_stack: Stack) -> None:
    worker = fresh_stack.worker()
    _, base = fresh_stack.api()
    wait_until(lambda: "noop" in httpx.get(base + "/agent/tools").text)
    assert httpx.post(base + "/agent/execute", json={"tool": "noop"}).status_code == 200
    worker.kill()
    # Watched through /ready, which counts the live workers the way admission does: a call sent
    # to find out would be accepted until then and wait in the queue. One client for the polls:
    # a new one each time costs more CPU than the API's answer.
    # Its last heartbeat (every 1 s) stops counting after dead_after (3 s), and the API looks
    # every second: about 4 s, and 6.9 s was seen once on a busy CI machine. The bound says
    # "seconds, not the queue timeout (60 s)"; how fast is the benchmark's business.
    with httpx.Client() as poller:
        wait_until(lambda: poller.get(base + "/ready").json()["checks"]["workers"]["live"] == 0, 15)
    r = httpx.post(base + "/agent/execute", json={"tool": "noop"})
    took = r.elapsed.total_seconds()
    assert r.json()["error"]["code"] == "NO_WORKERS"
    assert r.headers["retry-after"] == "2"
    assert r.json()["_agent"]["next_actions"] == [
        {"action": "retry", "tool": "noop", "same_request_id": True, "after_ms": 2000}]
    assert took < 2  # at once, not after waiting for a worker (the queue timeout is 60 s)
    # The tool is still listed: it is unavailable, not unknown.
    assert "noop" in httpx.get(base + "/agent/tools").text


def test_sigterm_drains_then_deregisters(fresh_stack: Stack) -> None:
    worker = fresh_stack.worker()
    _, base = fresh_stack.api()
    wait_until(lambda: "linger" in httpx.get(base + "/agent/tools").text)
    with httpx.Client(timeout=30) as client:
        result: list[httpx.Response] = []
        call = threading.Thread(target=lambda: result.append(client.post(
            base + "/agent/execute", json={"tool": "linger", "arguments": {"seconds": 4, "tag": "drain"}})))
        call.start()
        marked(fresh_stack.tmp / "linger-start-drain")
        worker.signal(signal.SIGTERM)
        # While it drains it takes no new work: once the API has seen the drain (its readiness
        # counts no live worker, as admission does), a new call is refused at once.
        wait_until(lambda: client.get(base + "/ready").json()["checks"]["workers"]["live"] == 0)
        assert httpx.post(base + "/agent/execute", json={"tool": "noop"}).status_code == 503
        assert call.is_alive(), "refused only after the drain, not while it drained"
        call.join(30)
    assert result[0].status_code == 200  # the running execution finished
    assert worker.popen.wait(10) == 0
    assert not (fresh_stack.tmp / "linger-cancelled-drain").exists()
    r = httpx.post(base + "/agent/execute", json={"tool": "noop"})
    assert r.json()["error"]["code"] == "NO_WORKERS"
