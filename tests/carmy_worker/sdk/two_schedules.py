"""Fixture for ``load_schedules``: two Toolboxes of one module both declare ``tick``."""

from __future__ import annotations

from carmy_worker import Context, Toolbox

first = Toolbox()
second = Toolbox()


@first.tool(effect="none")
def ping(ctx: Context) -> str:
    """Answer pong."""
    return "pong"


@second.tool(effect="none")
def pong(ctx: Context) -> str:
    """Answer ping."""
    return "ping"


first.schedule("tick", cron="* * * * *", tool="ping")
second.schedule("tick", cron="* * * * *", tool="pong")
