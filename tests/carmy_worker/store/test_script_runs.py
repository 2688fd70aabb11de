"""The one way a script runs (``store.scripts``): alone, or with WAIT after the writes that
matter (the script's own reply either way, one warning when the replicas fall short), and a
script cache that is empty (a new primary, a restarted Redis) costs nothing but a load."""

from __future__ import annotations

import logging
import time

import pytest
import redis
import redis.asyncio

from carmy_worker.store import scripts
from carmy_worker.store.batch import Batch
from carmy_worker.store.durable import Durability
from carmy_worker.store.scripts import SCRIPTS, Script, bind, bind_sync

SCRIPT = Script("TEST_INCR", "redis.call('INCR', KEYS[1]); return redis.call('GET', KEYS[1])")


def test_every_script_is_listed_once_by_name() -> None:
    import carmy_worker.store.attempts  # noqa: F401 - listed as their modules are imported
    assert SCRIPTS["SETTLE"].name == "SETTLE" and SCRIPTS["TEST_INCR"] is SCRIPT
    with pytest.raises(ValueError, match="two scripts are named TEST_INCR"):
        Script("TEST_INCR", "return 2")
    assert Script("TEST_INCR", SCRIPT.source).sha == SCRIPT.sha  # the same script again is harmless


async def test_no_replica_asked_for_runs_it_alone(ar: redis.asyncio.Redis) -> None:
    for durability in (None, Durability(0)):
        runs = bind(ar, SCRIPT, durability=durability, batch=Batch(ar))
        assert runs.durability is None and runs.batched  # nothing to wait for: batched as asked
    assert await bind(ar, SCRIPT)(keys=["n"], args=[]) == b"1"


async def test_a_wait_that_falls_short_still_answers_and_warns_once(
        ar: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture) -> None:
    # This Redis has no replica: every WAIT for one times out.
    call = bind(ar, SCRIPT, durability=Durability(1, timeout_ms=50), batch=Batch(ar))
    assert not call.batched  # a call that waits for replicas keeps its own round trip
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="carmy.store"):
        assert await call(keys=["n"], args=[]) == b"1"
        assert await call(keys=["n"], args=[]) == b"2"
    assert time.monotonic() - started >= 0.1  # each call waited for the replica
    assert [r.message for r in caplog.records].count(
        "writes reach 0 of the 1 replicas asked for (CARMY_REDIS_WAIT_REPLICAS) within 50 ms; going on without them"
    ) == 1


@pytest.mark.parametrize("durability", [None, Durability(1, timeout_ms=1)], ids=["alone", "with WAIT"])
async def test_an_empty_script_cache_loads_the_script_and_runs_it_once(
        ar: redis.asyncio.Redis, sync_redis: redis.Redis, durability: Durability | None) -> None:
    call = bind(ar, SCRIPT, durability=durability)
    sync_redis.script_flush()
    assert await call(keys=["n"], args=[]) == b"1"
    assert sync_redis.get("n") == b"1"
    sync_redis.script_flush()
    assert await scripts.run(ar, SCRIPT, ["n"], []) == b"2"


def test_a_blocking_client_loads_the_script_too(sync_redis: redis.Redis) -> None:
    sync_redis.delete("blocking")
    sync_redis.script_flush()
    assert bind_sync(sync_redis, SCRIPT)(keys=["blocking"], args=[]) == b"1"
    assert bind_sync(sync_redis, SCRIPT)(keys=["blocking"], args=[]) == b"2"
