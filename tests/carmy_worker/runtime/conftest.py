from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import AsyncIterator, Iterator

import pytest


@pytest.fixture(autouse=True)
async def _restore_signals() -> AsyncIterator[None]:
    """An arq worker installs SIGINT/SIGTERM handlers on the loop: take them off again."""
    yield
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)


@pytest.fixture(autouse=True)
def _collected() -> Iterator[None]:
    """What a test leaves to the garbage collector (workers, pools and their connections) is
    collected before the next one starts, outside any event loop: not by a collection that runs
    during a later test, where a connection's "unclosed" warning would fail that test instead
    (and where the tests that look for garbage cycles would find it)."""
    gc.collect()
    yield
    gc.collect()
