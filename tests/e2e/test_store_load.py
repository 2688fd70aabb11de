"""Busy is not down: a burst that queues for the API's Redis connections is answered (slower),
and a Redis that is gone is reported at once, to every new call."""

from __future__ import annotations

import asyncio
import collections
import time

import httpx

from tests.conftest import private_stack
from tests.support import Stack, wait_until, wait_until_async

# Per call, from sending to the answer, when Redis is gone. The README promises about a second;
# the margin is for a busy machine, and the old pool's worst case (2 s) stays above it.
UNAVAILABLE_WITHIN_S = 1.8


async def timed_burst(base: str, body: dict[str, object], n: int) -> list[tuple[int, str | None, float]]:
    """``n`` calls at once: (status, error code, seconds) each."""
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=None)) as client:
        async def one() -> tuple[int, str | None, float]:
            sent = time.monotonic()
            r = await client.post(base + "/agent/execute", json=body)
            return r.status_code, r.json().get("error", {}).get("code"), time.monotonic() - sent

        return await asyncio.gather(*(one() for _ in range(n)))


def test_a_burst_waits_for_the_pool_instead_of_failing(fresh_stack: Stack) -> None:
    for _ in range(4):
        fresh_stack.worker(wait=False)
    # Two connections for 256 callers: the submits go out on the one the batch keeps, anything
    # else queues for the other (the old pool gave up after 1 s).
    _, base = fresh_stack.api({"CARMY_REDIS_CONNECTIONS": "2"})
    wait_until(lambda: httpx.get(base + "/ready").status_code == 200 and
               httpx.get(base + "/ready").json()["checks"]["workers"]["live"] == 4)
    results = asyncio.run(timed_burst(base, {"tool": "linger", "arguments": {"seconds": 0.05}}, 256))
    assert collections.Counter((status, code) for status, code, _ in results) == {(200, None): 256}


def redis_ok(base: str) -> bool:
    return bool(httpx.get(base + "/ready", timeout=10).json()["checks"]["redis"]["ok"])


def test_new_calls_hear_that_redis_is_gone_within_a_second() -> None:
    with private_stack() as (server, stack):
        stack.worker()
        _, base = stack.api({"CARMY_REDIS_CONNECTIONS": "4"})
        wait_until(lambda: "linger" in httpx.get(base + "/agent/tools").text)

        async def scenario() -> list[tuple[int, str | None, float]]:
            # Calls in flight hold the pool's connections when Redis goes.
            busy = asyncio.ensure_future(timed_burst(base, {"tool": "linger", "arguments": {"seconds": 0.2}}, 64))
            await wait_until_async(lambda: (stack.tmp / "linger-start-").exists(), what="a call of the burst running")
            server.kill()
            # The API has seen the end of its connections: its readiness check says Redis is gone.
            await asyncio.to_thread(wait_until, lambda: not redis_ok(base), what="the API to see Redis gone")
            gone = await timed_burst(base, {"tool": "noop"}, 64)
            busy.cancel()
            return gone

        results = asyncio.run(scenario())
        assert {(status, code) for status, code, _ in results} == {(503, "STORE_UNAVAILABLE")}
        slowest = max(took for *_, took in results)
        assert slowest < UNAVAILABLE_WITHIN_S, f"the slowest STORE_UNAVAILABLE took {slowest:.2f} s"
