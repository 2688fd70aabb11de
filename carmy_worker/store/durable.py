"""Writes that a failover must not lose: a script call followed by ``WAIT`` for replicas.

Redis replicates asynchronously: a primary that dies can take its last writes with it, and the
replica promoted in its place never had them. For the writes Carmy's answers stand on (SUBMIT's
idempotency key, CLAIM's attempt, a final record), ``CARMY_REDIS_WAIT_REPLICAS`` > 0 makes the
writer wait until that many replicas have them (``WAIT``, on the same connection, in the same
round trip). When the replicas do not answer within ``CARMY_REDIS_WAIT_TIMEOUT`` ms the write
stands on the primary alone and the caller goes on (a warning says so): the answer is still
right, unless the primary fails before a replica catches up.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

log = logging.getLogger("carmy.store")


class Durability:
    """How many replicas the writes that matter wait for, and how long (one per process)."""

    def __init__(self, replicas: int = 0, timeout_ms: int = 500) -> None:
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self._short = False  # the last WAIT fell short: warn once per episode, not per write

    def acknowledged(self, acked: int) -> None:
        short = acked < self.replicas
        if short and not self._short:
            log.warning("writes reach %d of the %d replicas asked for (CARMY_REDIS_WAIT_REPLICAS) within %d ms; "
                        "going on without them", acked, self.replicas, self.timeout_ms)
        elif self._short and not short:
            log.info("writes reach %d replicas again", acked)
        self._short = short


class DurableScript:
    """A registered script, called like one, whose every call is followed by ``WAIT``."""

    def __init__(self, script: AsyncScript, durability: Durability) -> None:
        self._script = script
        self._durability = durability

    async def __call__(self, keys: list[Any], args: list[Any]) -> Any:
        client: Redis = self._script.registered_client
        d = self._durability
        for _ in range(2):
            # EVALSHA itself, not the script in the pipeline: redis-py would check that the
            # script exists first, one more round trip on every call.
            async with client.pipeline(transaction=False) as pipe:
                pipe.evalsha(self._script.sha, len(keys), *keys, *args)
                pipe.wait(d.replicas, d.timeout_ms)
                reply, acked = await pipe.execute(raise_on_error=False)
            if isinstance(reply, NoScriptError):  # a new primary, or a flushed script cache: nothing ran
                self._script.sha = await client.script_load(self._script.script)
                continue
            if isinstance(reply, Exception):
                raise reply
            if isinstance(acked, Exception):
                raise acked
            d.acknowledged(int(acked))
            return reply
        raise NoScriptError(f"script {self._script.sha} is not loaded")


def durable(script: AsyncScript, durability: Durability | None) -> AsyncScript | DurableScript:
    """``script`` itself when no replica is asked for, else the same call followed by ``WAIT``."""
    if durability is None or durability.replicas == 0:
        return script
    return DurableScript(script, durability)
