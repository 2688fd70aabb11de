"""The ledger and the fault log, indexed for the questions the reconciliation asks: which lines
a request has, which workers were killed or paused when, when Redis was down."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from chaos.model import Fault, LedgerLine

FROZEN_S = 1.0  # a run abandoned this soon after its worker woke counts as stopped by the pause
REDIS_GRACE_S = 1.0  # after Redis is back, the API's pool and the hub may take this to reconnect
# Redis's own loss window: under appendfsync everysec a kill -9 takes up to the last second of
# writes, and a failover takes what the primary had not yet passed to the promoted replica
# (asynchronous replication; far less than a second on loopback, unless a replica lagged).
LOSS_WINDOW_S = 1.0


class Facts:
    """The ledger and the fault log, indexed for the questions the rows ask."""

    def __init__(self, ledger: Iterable[LedgerLine], faults: list[Fault]) -> None:
        self.by_rid: dict[str, list[LedgerLine]] = defaultdict(list)
        for line in ledger:
            self.by_rid[line.rid].append(line)
        self.faults = faults
        self.killed = {f.pid: f.t for f in faults if f.kind == "worker-kill" and f.pid is not None}
        self.pauses = [(f.pid, f.t, f.t_end) for f in faults if f.kind == "worker-stop"]
        self.redis_down = [(f.t, f.t_end + REDIS_GRACE_S) for f in faults if f.kind in ("redis-term", "redis-kill")]
        # A failover is an outage from the kill until a replica is promoted; the old primary's
        # return as a replica later is no outage (nobody writes to it). A cluster's is an outage
        # of one primary's slots only, counted as the whole store's (the rows it excuses are info).
        self.redis_down += [(f.t, (f.promoted or f.t_end) + REDIS_GRACE_S) for f in faults
                            if f.kind in ("redis-failover", "cluster-failover", "cluster-hang")]
        # Where a write may be lost: just before a crash; and from just before a hang until the
        # hung primary wakes (it runs what its clients sent meanwhile before it learns it was
        # replaced, and then drops it for its new primary's data).
        self.losses = [(f.t - LOSS_WINDOW_S, f.t) for f in faults
                       if f.kind in ("redis-kill", "redis-failover", "cluster-failover")]
        self.losses += [(f.t - LOSS_WINDOW_S, (f.woke or f.promoted or f.t_end) + LOSS_WINDOW_S) for f in faults
                        if f.kind == "cluster-hang"]
        self.workers_out = [(f.t, f.t_end) for f in faults if f.kind.startswith("worker-")]

    def lines(self, rid: str, ev: str) -> list[LedgerLine]:
        return [line for line in self.by_rid.get(rid, []) if line.ev == ev]

    def paused_between(self, pid: int, start: float, end: float) -> bool:
        return any(p == pid and t < end and start < t_end for p, t, t_end in self.pauses)

    def frozen_from(self, pid: int, start: float, abandoned: float) -> float | None:
        """Where a run abandoned right after a pause of its worker really ended: the pause's start."""
        for p, t, t_end in self.pauses:
            if p == pid and start < t < abandoned <= t_end + FROZEN_S:
                return t
        return None

    def in_loss_window(self, t0: float, t1: float) -> bool:
        """Whether something between ``t0`` and ``t1`` was within ``LOSS_WINDOW_S`` before a Redis
        ``kill -9`` or failover, or during a hang: a write it made may be gone with that server."""
        return any(start <= t1 and t0 <= end for start, end in self.losses)

    def redis_was_down(self, t0: float, t1: float) -> bool:
        return any(t < t1 and t0 < t_end for t, t_end in self.redis_down)
