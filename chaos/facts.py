"""The ledger and the fault log, indexed for the questions the reconciliation asks: which lines
a request has, which workers were killed or paused when, when Redis was down."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from chaos.model import Fault, LedgerLine

FROZEN_S = 1.0  # a run abandoned this soon after its worker woke counts as stopped by the pause
REDIS_GRACE_S = 1.0  # after Redis is back, the API's pool and the hub may take this to reconnect


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

    def redis_was_down(self, t0: float, t1: float) -> bool:
        return any(t < t1 and t0 < t_end for t, t_end in self.redis_down)
