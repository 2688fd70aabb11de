"""Script calls made in the same turn of the event loop, sent to Redis together.

Under load many executions reach the same step at once (a LEASE hands a worker several jobs, an
API process submits the calls of many clients), and each script call used to be a write of its
own, on a connection of its own. On these machines that write, which also wakes Redis, is most
of a round trip's CPU, on both sides. ``Batch`` collects the calls made during one turn of the
loop and sends them as one pipeline, on one connection: not a transaction, each script is as
atomic as it always was, and each caller gets its own reply or error. A lone call goes out as it
is, not in a pipeline: one client at a time pays one turn of the loop and one task for it.

Only for scripts whose writes do not wait for replicas (``store.durable``): those keep their
own call and ``WAIT``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError


class _Call:
    __slots__ = ("args", "future", "keys", "script")

    def __init__(self, script: AsyncScript, keys: list[Any], args: list[Any], future: asyncio.Future[Any]) -> None:
        self.script = script
        self.keys = keys
        self.args = args
        self.future = future


class Batch:
    """The script calls of one turn of the event loop, on one client, sent together."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._waiting: list[_Call] = []
        self._sending: set[asyncio.Task[None]] = set()  # kept referenced until they are done

    def script(self, script: AsyncScript) -> BatchedScript:
        """``script``, called like one, its calls batched here."""
        return BatchedScript(self, script)

    def call(self, script: AsyncScript, keys: list[Any], args: list[Any]) -> asyncio.Future[Any]:
        """Queue one call; it goes out with the others of this turn of the loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._waiting.append(_Call(script, keys, args, future))
        if len(self._waiting) == 1:  # the first of this turn: the send runs once the turn is over
            loop.call_soon(self._send)
        return future

    def _send(self) -> None:
        calls, self._waiting = self._waiting, []
        calls = [call for call in calls if not call.future.done()]  # callers cancelled meanwhile
        if not calls:
            return
        task = asyncio.get_running_loop().create_task(self._one(calls[0]) if len(calls) == 1 else self._many(calls))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _one(self, call: _Call) -> None:
        try:
            reply = await call.script(keys=call.keys, args=call.args)  # loads the script if Redis lost it
        except BaseException as exc:
            _fail(call.future, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        _answer(call.future, reply)

    async def _many(self, calls: list[_Call]) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for call in calls:
                    # EVALSHA itself: the script in a pipeline would first check that it exists.
                    pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
                replies = await pipe.execute(raise_on_error=False)
        except BaseException as exc:  # the connection failed: every call of the batch did, or may have
            for call in calls:
                _fail(call.future, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        try:
            for call, reply in zip(calls, replies, strict=True):
                if isinstance(reply, NoScriptError):  # a restarted Redis lost the script: that call did not run
                    await self._one(call)
                elif isinstance(reply, Exception):
                    _fail(call.future, reply)
                else:
                    _answer(call.future, reply)
        except BaseException as exc:  # cancelled while a lost script was sent again: nobody waits for ever
            for call in calls:
                _fail(call.future, exc)
            raise


class BatchedScript:
    """A registered script whose calls go out in their turn's batch."""

    def __init__(self, batch: Batch, script: AsyncScript) -> None:
        self._batch = batch
        self._script = script

    async def __call__(self, keys: list[Any], args: list[Any]) -> Any:
        return await self._batch.call(self._script, keys, args)


def _answer(future: asyncio.Future[Any], reply: Any) -> None:
    if not future.done():
        future.set_result(reply)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if future.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(exc)


def batched(script: Any, batch: Batch) -> Any:
    """``script`` with its calls batched, unless it is not a plain script (``store.durable``'s,
    whose writes wait for replicas, keeps its own call and ``WAIT``)."""
    return batch.script(script) if isinstance(script, AsyncScript) else script
