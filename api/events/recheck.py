"""The safety net for a lost final event: one recheck, per API process, of every execution it
waits for.

An execution's record reaches its waiters with its ``final`` event (``api.events.hub``); if the
hub's connection drops, every waiter re-reads its record (``RESYNC``). An event lost with no
reconnection to explain it (a worker older than this API publishing elsewhere, a follower it
does not know of) would leave a waiter waiting for ever: so, every ``RECHECK_S`` (jittered, so
that API processes do not fall into step), this process asks Redis about all the executions it
waits for (a STATES per chunk of 100 of one partition's, a command each: ``store.reads``) and
wakes only the waiters of the ones that ended or that Redis lost (``ENDED`` in their mailbox):
they read their record as after any other wake-up. Ten thousand idle streams cost a hundred
round trips per tick, not ten thousand pipelines. The chunks are spread over up to half the
period (``SPREAD``, at most ``MAX_GAP_S`` apart): asked back to back, twenty chunks of 500 held
Redis and this process for some 30 ms every 5 s, and the calls made meanwhile waited behind
them (bench/README.md, "Heartbeats and rechecks that cost no more than what changes"); spread,
each chunk of 500 was still what the slowest calls waited behind ("The full check in steps").
Each execution is still asked about once a period.

The executions are the hub's (``EventHub.waiting``): every waiter registers there before its
execution can publish, so the recheck keeps no registry of its own.

It also keeps the process's view of whether the store can be reached (``down_since``), which
waiters read to know how long they have waited for an unreachable Redis.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Collection, Mapping

from redis.exceptions import RedisError

from api.events.mailbox import ENDED, Mailbox
from carmy_worker.loop import running_loop
from carmy_worker.store.reads import ENDED_CHUNK, Reads, chunks

log = logging.getLogger("carmy.api")

RECHECK_S = 5.0  # how often, on average, the waiting executions are asked about
JITTER = 0.2  # each pause is RECHECK_S times 1 ± JITTER
SPREAD = 0.5  # a pass's chunks are spread over at most this share of the period
MAX_GAP_S = 0.1  # and at most this far apart


class Recheck:
    """The executions this process waits for (``waiting``: each with its waiters' mailboxes, as
    the hub keeps them), rechecked by ``run`` (a task of the app's lifespan) or one pass at a
    time by ``once``."""

    def __init__(self, reads: Reads, waiting: Mapping[str, Collection[Mailbox]], *, every: float = RECHECK_S,
                 chunk: int = ENDED_CHUNK) -> None:
        self._reads = reads
        self._waiting = waiting
        self._every = every
        self._chunk = chunk
        # When the store was first found unreachable, by a recheck or a waiter's read, since it
        # was last reached; None while it is reachable.
        self.down_since: float | None = None

    def unreachable(self) -> None:
        """The store could not be reached (a read failed)."""
        if self.down_since is None:
            self.down_since = running_loop().time()

    def reached(self) -> None:
        """The store answered."""
        self.down_since = None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._every * random.uniform(1 - JITTER, 1 + JITTER))
            try:
                await self.once()
            except RedisError as exc:
                log.debug("recheck of waiting executions failed: %s", exc)  # down_since tells the waiters
            except Exception:  # a bug here must not end the safety net for the process's life
                log.exception("recheck of waiting executions failed")

    async def once(self) -> None:
        """Ask about every execution waited for, a chunk at a time (spread: see the module), and
        wake the waiters of those that ended. Raises ``RedisError`` (and notes the store
        unreachable) if Redis could not be asked."""
        if not self._waiting:
            return
        some = chunks(list(self._waiting), self._chunk)
        gap = min(MAX_GAP_S, self._every * SPREAD / len(some))
        for n, chunk in enumerate(some):
            if n:
                await asyncio.sleep(gap)
            try:
                ended = await self._reads.ended(chunk)
            except RedisError:
                self.unreachable()
                raise
            self.reached()
            for exec_id in ended:
                for mailbox in self._waiting.get(exec_id, ()):
                    mailbox.put_nowait(ENDED)
