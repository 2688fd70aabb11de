"""How the overview writes its figures, on the page as ``overview.js`` writes them live (keep
the two alike): rates with one decimal below 10, durations in ms below a second, times in UTC."""

from __future__ import annotations

import time
from typing import Any

from api.console.frame import LiveFrame

NONE = "–"


def rate(per_second: float) -> str:
    return f"{per_second:.1f}" if per_second < 10 else f"{per_second:.0f}"


def duration(ms: float | None) -> str:
    if ms is None:
        return NONE
    if ms < 10:
        return f"{ms:.1f} ms"
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def clock(ms: int) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(ms / 1000))


def workers_alive(frame: LiveFrame | None) -> str:
    if frame is None or frame.point is None:
        return NONE
    return f"{sum(w.alive for w in frame.workers)} of {len(frame.workers)}"


def slots_busy(frame: LiveFrame | None) -> str:
    if frame is None or frame.point is None:
        return NONE
    alive = [w for w in frame.workers if w.alive]
    return f"{sum(w.busy for w in alive)} of {sum(w.slots for w in alive)}"


# What the template calls them.
FORMATS: dict[str, Any] = {"rate": rate, "duration": duration, "clock": clock,
                         "workers_alive": workers_alive, "slots_busy": slots_busy}
