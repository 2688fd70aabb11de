from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator

import pytest


@pytest.fixture(autouse=True)
async def _restore_signals() -> AsyncIterator[None]:
    """An arq worker installs SIGINT/SIGTERM handlers on the loop: take them off again."""
    yield
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)
