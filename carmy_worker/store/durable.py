"""Writes that a failover must not lose: a script call followed by ``WAIT`` for replicas.

Redis replicates asynchronously: a primary that dies can take its last writes with it, and the
replica promoted in its place never had them. For the writes Carmy's answers stand on (SUBMIT's
idempotency key, CLAIM's attempt, a final record), ``CARMY_REDIS_WAIT_REPLICAS`` > 0 makes the
writer wait until that many replicas have them (``WAIT``, on the same connection, in the same
round trip). When the replicas do not answer within ``CARMY_REDIS_WAIT_TIMEOUT`` ms the write
stands on the primary alone and the caller goes on (a warning says so): the answer is still
right, unless the primary fails before a replica catches up. A script bound with a
``Durability`` (``store.scripts.bind``) is run that way by ``store.scripts.run``.
"""

from __future__ import annotations

import logging

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
