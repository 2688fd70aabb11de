"""How the Executions and Jobs pages write times, durations and sizes: UTC to the millisecond
(the store's own precision), durations in ms below a second. Handed to their templates as is."""

from __future__ import annotations

import time
from typing import Any

NONE = "–"


def at_ms(ms: int | None) -> str:
    """Unix ms as ``2026-12-02 10:00:00.123`` (UTC)."""
    if ms is None:
        return NONE
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}"


def at(rfc3339: str | None) -> str:
    """An RFC 3339 time of the wire (``2026-12-02T10:00:00.123Z``) written as ``at_ms`` writes one."""
    return NONE if not rfc3339 else rfc3339.replace("T", " ").removesuffix("Z")


def took(ms: int | None) -> str:
    if ms is None:
        return NONE
    return f"{ms} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def size(n: int) -> str:
    return f"{n} bytes" if n < 1024 else f"{n / 1024:.1f} KiB"


# What the templates call them.
WORDING: dict[str, Any] = {"at_ms": at_ms, "at": at, "took": took, "size": size}
