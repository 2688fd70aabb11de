"""A second catalog: a worker serving these makes the catalog change."""

from __future__ import annotations

import msgspec

from carmy_worker import Context, Toolbox

tools = Toolbox()


class Pong(msgspec.Struct):
    pong: bool


@tools.tool(effect="none", idempotent=True, parallel_safe=True)
async def ping(ctx: Context) -> Pong:
    """Answer pong."""
    return Pong(pong=True)
