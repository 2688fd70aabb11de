"""Fixture for ``load_tools``: two Toolboxes of one module both define ``ping``."""

from __future__ import annotations

from carmy_worker import Context, Toolbox

first = Toolbox()
second = Toolbox()


@first.tool(effect="none")
def ping(ctx: Context) -> str:
    """Answer pong."""
    return "pong"


@second.tool(effect="none", name="ping")
def ping_again(ctx: Context) -> str:
    """Answer pong, a second time."""
    return "pong"
