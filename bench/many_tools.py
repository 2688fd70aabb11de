"""A toolbox of ``BENCH_TOOLS`` tools (default 10), for the catalog's cost curve (bench/sizes.py):
``python -m carmy_worker bench.many_tools`` with ``BENCH_TOOLS=10000`` serves ten thousand.

Each tool takes a small typed object, so its schemas are of the size real tools' are; they
share one function, since the catalog's cost is in the specs, not in what the tools do.
"""

from __future__ import annotations

import os

from bench.tools import Empty, ForecastInput
from carmy_worker import Context, Toolbox

COUNT = int(os.environ.get("BENCH_TOOLS", "10"))

tools = Toolbox()


async def forecast(ctx: Context, input: ForecastInput) -> Empty:
    """A forecast for a city, for a few days (does nothing)."""
    return Empty()


def name(i: int) -> str:
    return f"forecast_{i:05d}"


for _i in range(COUNT):
    tools.tool(name=name(_i), description=f"Forecast number {_i}: the weather in a city, for a few days.",
               effect="read", idempotent=True, parallel_safe=True)(forecast)
