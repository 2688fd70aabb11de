"""The ledger of side effects, kept outside Redis: one append-only file per worker process.

Each line is written with one ``write`` on a descriptor opened with ``O_APPEND``, so lines from
the tool threads of one process never interleave, and a line is in the kernel's page cache the
moment the call returns: a ``kill -9`` right after loses nothing (only a machine crash could).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import msgspec

from carmy_worker import Context
from chaos.model import LedgerEvent, LedgerLine

ENV_DIR = "CHAOS_LEDGER_DIR"

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(LedgerLine).decode


class Ledger:
    """The writer of one process's ledger file, opened on first use."""

    def __init__(self, directory: Path | None = None) -> None:
        self._directory = directory
        self._fd: int | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def write(self, ev: LedgerEvent, ctx: Context, tool: str) -> None:
        """Appends one line about the execution ``ctx`` serves, with its fencing attempt."""
        line = LedgerLine(ev=ev, rid=ctx.request_id or "", xid=ctx.execution_id, tool=tool, pid=os.getpid(),
                          t=time.time(), fence=ctx.attempt)
        os.write(self._descriptor(), _encode(line) + b"\n")

    def _descriptor(self) -> int:
        with self._lock:
            if self._fd is None or self._pid != os.getpid():
                directory = self._directory or Path(os.environ[ENV_DIR])
                path = directory / f"ledger-{os.getpid()}.jsonl"
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                self._pid = os.getpid()
            return self._fd


def read(directory: Path) -> list[LedgerLine]:
    """Every whole line of every ledger file in ``directory``, in time order. A line cut short
    (impossible with O_APPEND writes this small, but cheap to tolerate) is skipped."""
    lines: list[LedgerLine] = []
    for path in sorted(directory.glob("ledger-*.jsonl")):
        for raw in path.read_bytes().splitlines():
            try:
                lines.append(_decode(raw))
            except msgspec.DecodeError:
                continue
    lines.sort(key=lambda line: line.t)
    return lines
