"""The tools the interop suite's worker serves: ``basic``'s, and one with a title and an output
that is not an object (2026-07-28 serves both; earlier revisions have no non-object outputs)."""

from __future__ import annotations

import inspect

from carmy_worker import Context, Toolbox
from tests.toolsets.basic import tools  # noqa: F401 - served: the worker serves every Toolbox here

titled = Toolbox()

SKUS_TITLE = "List the SKUs"
# ``@tool(title=...)`` comes with issue 13 (item 4). Until the decorator takes it the tool is served
# untitled, so that the rest of the suite runs; the test reading its title fails meanwhile.
_TITLE = {"title": SKUS_TITLE} if "title" in inspect.signature(Toolbox.tool).parameters else {}


@titled.tool(effect="read", idempotent=True, parallel_safe=True, **_TITLE)
async def skus(ctx: Context) -> list[str]:
    """The SKUs on sale: a list, not an object."""
    return ["KB-01", "MS-02"]
