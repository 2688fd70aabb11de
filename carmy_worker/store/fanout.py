"""One script run in every partition at once: the roster's beats, the janitor's scans, the
console's pulse (docs/architecture.md, section 3: each partition is a cell, and a reader that
wants the whole deployment asks each cell).

The calls go out in one pipeline, with any plain reads the caller adds behind them: one round
trip on one Redis; on a Redis Cluster the client's pipeline sends each command to its slot's
primary (one round trip per primary). A ``NOSCRIPT`` reply (a restarted Redis, a new primary:
nothing ran) loads the script and runs that call again alone, as ``scripts.run`` does.

On a Redis Cluster such a pipeline is all or nothing when a node cannot be reached: redis-py
takes a connection of every node the pipeline names before it sends anything, so a primary that
was killed (until its replica is promoted) fails the calls bound for every other primary too.
``run_each_alone`` and ``run_each_alone_sync`` send each call on its own instead, for a caller
whose calls must land wherever they can (the roster's beats, the janitor's scans).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import redis as sync_redis
from redis.asyncio import Redis
from redis.exceptions import NoScriptError, RedisError

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


async def run_each_alone(redis: Redis, script: Script, calls: Sequence[Call]) -> list[Any]:
    """``script`` once per call, each in a round trip of its own and all at once: every call
    whose node answers runs, whatever becomes of the others. The reply of each, or the
    ``RedisError`` (or ``OSError``) it got."""
    replies = await asyncio.gather(*(run(redis, script, call_keys, args) for call_keys, args in calls),
                                   return_exceptions=True)
    for reply in replies:
        if isinstance(reply, BaseException) and not isinstance(reply, RedisError | OSError):
            raise reply
    return list(replies)


async def run_each_reaching(redis: Redis, script: Script, calls: Sequence[Call]) -> list[Any]:
    """``run_each`` (its calls' replies) while every node answers; when its pipeline fails (on
    a cluster, as a whole, one primary being down), each call alone (``run_each_alone``): then
    the reply of each call is its reply or its error. For sweeps whose every partition's part
    stands alone (the janitor's scans, the audit trail's trims)."""
    try:
        replies, _ = await run_each(redis, script, calls)
    except (RedisError, OSError):
        if len(calls) < 2:
            raise
        return await run_each_alone(redis, script, calls)
    return replies


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


def run_each_alone_sync(redis: sync_redis.Redis, script: Script, calls: Sequence[Call]) -> list[Any]:
    """``script`` once per call, each in a round trip of its own: every call whose node answers
    runs, whatever becomes of the others. The reply of each, or the ``RedisError`` it got."""
    alone = bind_sync(redis, script)
    replies: list[Any] = []
    for call_keys, args in calls:
        try:
            replies.append(alone(call_keys, args))
        except sync_redis.RedisError as exc:
            replies.append(exc)
    return replies
