"""WAIT after the writes that matter: the script's own reply either way, one warning when the
replicas fall short, and a script cache that is empty (a new primary) costs nothing."""

from __future__ import annotations

import logging
import time

import pytest
import redis
import redis.asyncio

from carmy_worker.store.durable import Durability, DurableScript, durable

SCRIPT = "redis.call('INCR', KEYS[1]); return redis.call('GET', KEYS[1])"


async def test_no_replica_asked_for_is_the_script_itself(ar: redis.asyncio.Redis) -> None:
    script = ar.register_script(SCRIPT)
    assert durable(script, None) is script
    assert durable(script, Durability(0)) is script


async def test_a_wait_that_falls_short_still_answers_and_warns_once(
        ar: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture) -> None:
    # This Redis has no replica: every WAIT for one times out.
    call = durable(ar.register_script(SCRIPT), Durability(1, timeout_ms=50))
    assert isinstance(call, DurableScript)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="carmy.store"):
        assert await call(keys=["n"], args=[]) == b"1"
        assert await call(keys=["n"], args=[]) == b"2"
    assert time.monotonic() - started >= 0.1  # each call waited for the replica
    assert [r.message for r in caplog.records].count(
        "writes reach 0 of the 1 replicas asked for (CARMY_REDIS_WAIT_REPLICAS) within 50 ms; going on without them"
    ) == 1


async def test_an_empty_script_cache_loads_the_script_and_runs_it_once(
        ar: redis.asyncio.Redis, sync_redis: redis.Redis) -> None:
    call = durable(ar.register_script(SCRIPT), Durability(1, timeout_ms=1))
    sync_redis.script_flush()
    assert await call(keys=["n"], args=[]) == b"1"
    assert sync_redis.get("n") == b"1"
