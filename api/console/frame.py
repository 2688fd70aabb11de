"""The live overview's frame: what the sampler (``live.py``) makes of one second, encoded to JSON
once and sent as is to every viewer (``pages/overview.py``), and what ``overview.js`` reads.

Times are Redis's clock (ms since the epoch), durations ms, rates per second.
"""

from __future__ import annotations

import msgspec
from msgspec import Struct


class Point(Struct, frozen=True, kw_only=True):
    """One second of the charts: executions finished per second (whatever their status) and
    errors per second (failed or timed out), then, as of ``t``, the executions accepted and not
    started (``queued``), admitted and not settled (``pending``), and running (``in_flight``)."""

    t: int
    completions: float
    errors: float
    queued: int
    pending: int
    in_flight: int


class WorkerRow(Struct, frozen=True, kw_only=True):
    """A worker listed in the roster: its ``slots`` (``CARMY_CONCURRENCY``; 0 when its info does
    not say), ``busy`` ones (executions it claimed and has not settled), when it last heartbeat
    (``last_seen``), whether it drains (takes no new work) and whether it is alive, by the rule
    the catalog judges workers by. A dead one is listed a few seconds, then no more."""

    id: str
    host: str
    pid: int
    group: str
    slots: int
    busy: int
    last_seen: int
    draining: bool
    alive: bool


class QueueRow(Struct, frozen=True, kw_only=True):
    """A group's queue: the workers serving the same tools, their jobs ``due`` (waiting for a
    slot) and the queue's ``length`` (leased and deferred jobs too)."""

    group: str
    due: int
    length: int


class ToolRow(Struct, frozen=True, kw_only=True):
    """A tool with executions in the window: finished and errors per second, and the median and
    99th percentile of its run time (ms; None when none ran, as for a cancelled call)."""

    tool: str
    completions: float
    errors: float
    p50: float | None
    p99: float | None
    runs: int


class LiveFrame(Struct, frozen=True, kw_only=True):
    """One second of the overview. ``seq`` counts frames in this API process. ``error``: Redis did
    not answer (``point`` is None then, and the lists empty: a gap in the charts). ``window``: the
    seconds the tools' figures cover. ``tools``: the busiest tools (``tools_left_out`` more
    were active), by name."""

    seq: int
    point: Point | None
    workers: list[WorkerRow] = []
    queues: list[QueueRow] = []
    tools: list[ToolRow] = []
    tools_left_out: int = 0
    window: float = 0.0
    error: str = ""


encoder = msgspec.json.Encoder()
