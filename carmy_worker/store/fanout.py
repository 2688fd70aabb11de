"""One script run in every partition at once: the roster's beats, the janitor's scans, the
console's pulse (docs/architecture.md, section 3: each partition is a cell, and a reader that
wants the whole deployment asks each cell).

The calls go out in one pipeline, with any plain reads the caller adds behind them: one round
trip on one Redis; on a Redis Cluster the client's pipeline sends each command to its slot's
primary (one round trip per primary). A ``NOSCRIPT`` reply (a restarted Redis, a new primary:
nothing ran) loads the script and runs that call again alone, as ``scripts.run`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis as sync_redis
from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from carmy_worker.store.scripts import Script, bind_sync, run

Call = tuple[list[Any], list[Any]]  # one call's keys and arguments


def _queue(pipe: Any, script: Script, calls: Sequence[Call], then: Callable[[Any], None] | None) -> None:
    for call_keys, args in calls:
        pipe.execute_command(*script.command(call_keys, args))
    if then is not None:
        then(pipe)


def _raised(replies: Sequence[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return list(replies)


async def run_each(redis: Redis, script: Script, calls: Sequence[Call],
                   then: Callable[[Any], None] | None = None) -> tuple[list[Any], list[Any]]:
    """Run ``script`` once per call, and ``then``'s reads behind them, in one pipeline: the
    calls' replies in order, and the reads'. The first error is raised."""
    async with redis.pipeline(transaction=False) as pipe:
        _queue(pipe, script, calls, then)
        replies = await pipe.execute(raise_on_error=False)
    for i, (call_keys, args) in enumerate(calls):
        if isinstance(replies[i], NoScriptError):
            replies[i] = await run(redis, script, call_keys, args)
    return _raised(replies[:len(calls)]), _raised(replies[len(calls):])


def run_each_sync(redis: sync_redis.Redis, script: Script, calls: Sequence[Call],
                  then: Callable[[Any], None] | None = None) -> tuple[list[Any], list[Any]]:
    """``run_each`` on a blocking client (the heartbeat thread's, the health check's)."""
    with redis.pipeline(transaction=False) as pipe:
        _queue(pipe, script, calls, then)
        replies = pipe.execute(raise_on_error=False)
    alone = bind_sync(redis, script)
    for i, (call_keys, args) in enumerate(calls):
        if isinstance(replies[i], NoScriptError):
            replies[i] = alone(call_keys, args)
    return _raised(replies[:len(calls)]), _raised(replies[len(calls):])
