"""The garbage collector of a serving process: the API and each worker.

Python's default runs a young-generation collection every 700 net allocations of container
objects. Each call in flight holds a few hundred (its task, coroutines, dicts, futures), so under
load a collection ran every other call and found nearly everything alive: 8 % of the API's CPU,
for objects that reference counting frees moments later. ``YOUNG`` lets them die first (the
collector still runs, for cycles, as allocations grow), and what was built at start-up is frozen
out of every collection.
"""

from __future__ import annotations

import gc

YOUNG = 20_000  # net allocations between young-generation collections (Python's default: 700)


def for_serving() -> None:
    """Collect the young generation every ``YOUNG`` allocations; call it once, at start."""
    gc.set_threshold(YOUNG, *gc.get_threshold()[1:])


def freeze_start_up() -> None:
    """Leave what exists now (modules, settings, tools) out of every later collection; call it
    once the process is ready to serve."""
    gc.freeze()
