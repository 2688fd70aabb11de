"""The tools the interop suite's worker serves: ``basic``'s, and one with a title and an output
that is not an object (2026-07-28 serves both; earlier revisions have no non-object outputs)."""

from __future__ import annotations

from carmy_worker import Context, Toolbox
from tests.toolsets.basic import tools  # noqa: F401 - served: the worker serves every Toolbox here

titled = Toolbox()

SKUS_TITLE = "List the SKUs"


@titled.tool(effect="read", idempotent=True, parallel_safe=True, title=SKUS_TITLE)
async def skus(ctx: Context) -> list[str]:
    """The SKUs on sale: a list, not an object."""
    return ["KB-01", "MS-02"]
