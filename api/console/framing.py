"""From readings (``store.pulse``) to frames (``frame.py``): who the workers are, what changed
since the last reading, and the per-tool figures over the last seconds. No I/O: the sampler
(``live.py``) reads, this module makes sense of what it read.
"""

from __future__ import annotations

import msgspec
from msgspec import Struct

from api.console.frame import LiveFrame, Point, QueueRow, ToolRow, WorkerRow
from api.console.rates import Step, ToolStep, Window, grown, quantile
from carmy_worker.store.pulse import Pulse

# A dead worker stays listed, as dead, this long after its death is known (ms), then leaves the
# frame: long enough to be noticed, short enough that a page of dead workers never builds up.
DEAD_SHOWN_MS = 10_000
# The per-tool table lists at most this many tools, the busiest: a frame stays small (a few KB)
# with a thousand tools busy.
MAX_TOOLS = 100


class _Card(Struct, frozen=True):
    """What the overview shows of a worker's info (``wire.WorkerInfo``): decoding skips its tools."""

    group: str
    host: str = ""
    pid: int = 0
    concurrency: int = 0


_card_decoder = msgspec.msgpack.Decoder(_Card)


class Framer:
    """Turns each reading into a frame, remembering the workers' infos and the last reading (for
    differences) and summing the last ``window`` steps for the per-tool figures."""

    def __init__(self, *, window: int) -> None:
        self._cards: dict[str, _Card] = {}
        self._last: Pulse | None = None
        self.window = Window(window)

    def known(self) -> list[str]:
        """The workers whose info PULSE need not send again."""
        return list(self._cards)

    def groups(self) -> list[str]:
        """The groups whose queues to measure: those of the workers listed, dead ones included (a
        group whose workers all died is the queue that backs up)."""
        return sorted({card.group for card in self._cards.values()})

    def frame(self, pulse: Pulse, seq: int) -> LiveFrame:
        self._learn(pulse)
        step = self._step(pulse)
        self._last = pulse
        if step is not None:
            self.window.push(step)
        workers = self._workers(pulse)
        tools, left_out = self._tools()
        in_flight = sum(pulse.busy.values())
        point = Point(t=pulse.now, completions=step.per_second(step.finished) if step else 0.0,
                      errors=step.per_second(step.errors) if step else 0.0,
                      queued=pulse.queued, pending=pulse.pending, in_flight=in_flight)
        queues = [QueueRow(group=g, due=q.due, length=q.length) for g, q in sorted(pulse.queues.items())]
        return LiveFrame(seq=seq, point=point, workers=workers, queues=queues, tools=tools, tools_left_out=left_out,
                         window=self.window.ms / 1000)

    def _learn(self, pulse: Pulse) -> None:
        for worker_id, raw in pulse.infos.items():
            try:
                self._cards[worker_id] = _card_decoder.decode(raw)
            except msgspec.DecodeError:
                self._cards[worker_id] = _Card(group="?")  # not a worker of ours: listed, never decoded again
        for gone in [w for w in self._cards if w not in pulse.roster.last_seen]:
            del self._cards[gone]  # forgotten by the janitor (an hour after it left)

    def _step(self, pulse: Pulse) -> Step | None:
        last = self._last
        if last is None or pulse.now <= last.now:  # the first reading, or a new primary's clock went back
            return None
        return Step.between(pulse.now - last.now, grown(last.executions, pulse.executions), grown(last.run, pulse.run))

    def _workers(self, pulse: Pulse) -> list[WorkerRow]:
        roster, rows = pulse.roster, []
        for worker_id, seen in sorted(roster.last_seen.items()):
            alive = roster.alive(worker_id)
            if not alive and seen < roster.cutoff - DEAD_SHOWN_MS:
                continue
            card = self._cards.get(worker_id) or _Card(group="")
            rows.append(WorkerRow(id=worker_id, host=card.host, pid=card.pid, group=card.group,
                                  slots=card.concurrency, busy=pulse.busy.get(worker_id, 0), last_seen=int(seen),
                                  draining=worker_id in roster.draining, alive=alive))
        return rows

    def _tools(self) -> tuple[list[ToolRow], int]:
        window = self.window
        busiest = sorted(window.tools.items(), key=lambda item: (-item[1].errors, -item[1].finished, item[0]))
        rows = [_row(tool, part, window) for tool, part in busiest[:MAX_TOOLS]]
        return sorted(rows, key=lambda row: row.tool), max(0, len(busiest) - MAX_TOOLS)


def _row(tool: str, part: ToolStep, window: Window) -> ToolRow:
    return ToolRow(tool=tool, completions=window.per_second(part.finished), errors=window.per_second(part.errors),
                   p50=quantile(part.buckets, 0.5), p99=quantile(part.buckets, 0.99), runs=sum(part.buckets))
