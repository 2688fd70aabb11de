"""Ledger lines as a chaos tool writes them, for the checkers' tests."""

from __future__ import annotations

from chaos.model import LedgerEvent, LedgerLine


def run(rid: str, xid: str, tool: str, pid: int, start: float, end: float | None,
        ev: LedgerEvent = "effect") -> list[LedgerLine]:
    """One run of ``tool`` for request ``rid`` as execution ``xid`` in process ``pid``: started at
    ``start``, and ended with ``ev`` at ``end`` (None: it never ended, killed mid-run)."""
    lines = [LedgerLine(ev="started", rid=rid, xid=xid, tool=tool, pid=pid, t=start)]
    if end is not None:
        lines.append(LedgerLine(ev=ev, rid=rid, xid=xid, tool=tool, pid=pid, t=end))
    return lines
