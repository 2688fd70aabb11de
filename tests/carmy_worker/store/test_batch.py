"""Script calls of one turn of the event loop go out together, each caller getting its own answer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio
from redis.exceptions import ConnectionError, ResponseError

from carmy_worker.store.batch import Batch

# Appends ARGV[1] to a list and answers with the list's length; fails on demand.
APPEND = """
if ARGV[1] == 'fail' then return redis.error_reply('asked to fail') end
return redis.call('RPUSH', KEYS[1], ARGV[1])
"""


class CountingPipelines:
    """Counts the pipelines a client opens (one per batch of more than one call)."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.opened = 0
        original = client.pipeline

        def pipeline(*args: Any, **kwargs: Any) -> Any:
            self.opened += 1
            return original(*args, **kwargs)

        client.pipeline = pipeline  # type: ignore[method-assign]


async def test_calls_of_one_turn_go_out_in_one_pipeline_each_with_its_own_reply(ar: redis.asyncio.Redis) -> None:
    pipelines = CountingPipelines(ar)
    script = Batch(ar).script(ar.register_script(APPEND))
    replies = await asyncio.gather(*(script(keys=["l"], args=[str(i)]) for i in range(20)))
    assert sorted(replies) == list(range(1, 21))
    assert await ar.lrange("l", 0, -1) == [str(i).encode() for i in range(20)]  # in the order called
    assert pipelines.opened == 1


async def test_a_lone_call_goes_out_as_it_is(ar: redis.asyncio.Redis) -> None:
    pipelines = CountingPipelines(ar)
    script = Batch(ar).script(ar.register_script(APPEND))
    assert await script(keys=["l"], args=["a"]) == 1
    assert await script(keys=["l"], args=["b"]) == 2
    assert pipelines.opened == 0


async def test_an_error_is_its_callers_only(ar: redis.asyncio.Redis) -> None:
    script = Batch(ar).script(ar.register_script(APPEND))
    results = await asyncio.gather(script(keys=["l"], args=["a"]), script(keys=["l"], args=["fail"]),
                                   script(keys=["l"], args=["b"]), return_exceptions=True)
    assert results[0] == 1 and results[2] == 2
    assert isinstance(results[1], ResponseError) and "asked to fail" in str(results[1])


async def test_scripts_a_restarted_redis_lost_are_loaded_again(ar: redis.asyncio.Redis) -> None:
    script = Batch(ar).script(ar.register_script(APPEND))
    await script(keys=["l"], args=["warm"])
    await ar.script_flush()
    replies = await asyncio.gather(*(script(keys=["l"], args=[str(i)]) for i in range(3)))
    assert sorted(replies) == [2, 3, 4]


async def test_a_cancelled_caller_leaves_the_others_their_answers(ar: redis.asyncio.Redis) -> None:
    script = Batch(ar).script(ar.register_script(APPEND))
    first = asyncio.ensure_future(script(keys=["l"], args=["a"]))
    gone = asyncio.ensure_future(script(keys=["l"], args=["b"]))
    last = asyncio.ensure_future(script(keys=["l"], args=["c"]))
    await asyncio.sleep(0)  # all three queued in the same turn
    gone.cancel()
    assert sorted([await first, await last]) == [1, 2]
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert await ar.lrange("l", 0, -1) == [b"a", b"c"]  # cancelled before it was sent: never ran


async def test_a_failed_connection_fails_every_call_of_the_batch() -> None:
    dead = redis.asyncio.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    script = Batch(dead).script(dead.register_script(APPEND))
    results = await asyncio.gather(*(script(keys=["l"], args=[str(i)]) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, (ConnectionError, OSError)) for r in results), results
    await dead.aclose()
