"""A worker module with a schedule firing every second: each run appends its request id (which
names the occurrence) to ``ticks`` in ``CARMY_TEST_DIR``, so a test counts occurrences, and
duplicates, outside Redis."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from carmy_worker import Context, Toolbox

tools = Toolbox()
OUT = Path(os.environ.get("CARMY_TEST_DIR", "/tmp"))


class Tick(msgspec.Struct):
    label: str


class Ticked(msgspec.Struct):
    occurrence: str


@tools.tool(effect="write", idempotent=False, parallel_safe=True)
async def tick(ctx: Context, input: Tick) -> Ticked:
    """Appends the occurrence it runs for to a file."""
    with (OUT / "ticks").open("a") as f:
        f.write(f"{ctx.request_id} {input.label}\n")
    return Ticked(ctx.request_id or "")


tools.schedule("every-second", cron="* * * * * *", tool="tick", arguments={"label": "s"}, grace=30)
