"""A worker module whose shared resource is closed when the worker stops
(``carmy_worker.sdk.lifecycle``): the close writes ``closed`` in ``CARMY_TEST_DIR``, so a test
sees from outside the process that its stop reached the tools."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from carmy_worker import Context, Toolbox
from carmy_worker.sdk import lifecycle

tools = Toolbox()
OUT = Path(os.environ.get("CARMY_TEST_DIR", "/tmp"))


class Nothing(msgspec.Struct):
    pass


@tools.tool(effect="read", idempotent=True)
async def ping(ctx: Context, input: Nothing) -> Nothing:
    """Answers nothing."""
    return Nothing()


async def _close() -> None:
    (OUT / "closed").write_text("closed\n")


lifecycle.on_shutdown(_close)
