"""Parsing Server-Sent Events the way a client would."""

from __future__ import annotations

import json
from typing import Any


def parse(text: str) -> list[tuple[str, Any]]:
    """``[(event, data), ...]``; comments (keep-alives) are skipped."""
    events = []
    for block in text.split("\n\n"):
        name, data = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
        if name is not None:
            events.append((name, data))
    return events
