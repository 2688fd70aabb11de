"""Fixture for ``load_tools`` and ``load_schedules``: one Toolbox bound to two names, plus a second
Toolbox, each with a schedule."""

from __future__ import annotations

from carmy_worker import Context, Toolbox

tools = Toolbox()
also_tools = tools
more = Toolbox()


@tools.tool(effect="none")
def ping(ctx: Context) -> str:
    """Answer pong."""
    return "pong"


@more.tool(effect="read")
def pong(ctx: Context) -> str:
    """Answer ping."""
    return "ping"


tools.schedule("ping.hourly", cron="@hourly", tool="ping")
more.schedule("pong.nightly", cron="0 3 * * *", tool="pong", timezone="Europe/Lisbon")
