"""The chaos tools' ledger: lines written from several threads come back whole, in time order,
with the fencing attempt when the context has one; and the tool module declares the mix the
reconciliation relies on (the jobs' tools and the schedule among them)."""

from __future__ import annotations

import threading
from pathlib import Path

from carmy_worker import AgentContext, Context
from chaos import ledger
from chaos.model import LedgerEvent
from chaos.tools import EXCLUSIVE, IDEMPOTENT, JOB_TOOLS, TICK, tools


def test_lines_from_many_threads_come_back_whole(tmp_path: Path) -> None:
    writer = ledger.Ledger(tmp_path)

    def write(i: int) -> None:
        ctx = Context(execution_id=f"x{i}", tool="charge", request_id=f"r{i}", agent=AgentContext(),
                      emit=lambda *_: None, attempt=i % 3 + 1)
        events: tuple[LedgerEvent, ...] = ("started", "effect")
        for ev in events:
            writer.write(ev, ctx, "charge")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (tmp_path / "ledger-1.jsonl").write_bytes(b'{"ev":"effect","rid":"cut')  # a line cut short is skipped
    lines = ledger.read(tmp_path)
    assert len(lines) == 100
    assert [line.t for line in lines] == sorted(line.t for line in lines)
    assert {(line.rid, line.fence) for line in lines} == {(f"r{i}", i % 3 + 1) for i in range(50)}


def test_the_tool_mix() -> None:
    assert IDEMPOTENT == {"charge": False, "charge_sync": False, "put": True, "put_sync": True, "serial": False,
                          "job_put": True, "job_charge": False, "tick": False, "hook_charge": False,
                          "hook_job": False, "named": True}
    assert sorted(EXCLUSIVE) == ["serial"]
    assert set(IDEMPOTENT) >= JOB_TOOLS
    assert [(s.name, s.cron, s.tool) for s in tools.schedules] == [(TICK, "* * * * * *", "tick")]
