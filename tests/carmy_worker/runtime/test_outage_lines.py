"""What a worker's loop says while Redis is out of reach: one line as it goes, one once Redis
answers again, nothing in between. With several partitions a turn of the loop can pass without
a command (no partition known to have work, so no LEASE before the wait): it used to say the
queue was reachable again each such turn, and unreachable again at the wait's failure, two lines
every retry. A real worker (arq's loop, the runtime, the store's scripts) in this process, on a
real Redis cut off and then reached again (through ``tests.proxy``: its connections reset and new
ones refused, the port kept)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.carmy_worker.runtime.inprocess import WAIT_S, worker_in_process
from tests.cells import partitions
from tests.proxy import CuttableProxy
from tests.support import private_redis, wait_until_async

TURNS_DOWN = 5  # turns of the loop while Redis is down: past the first retries' backoff


def said(caplog: pytest.LogCaptureFixture, start: str) -> int:
    return sum(1 for r in caplog.records if r.name == "carmy.queue" and r.getMessage().startswith(start))


@pytest.mark.slow
@pytest.mark.parametrize("count", [1, 4])
async def test_an_outage_is_one_line_as_it_begins_and_one_as_it_ends(
        count: int, caplog: pytest.LogCaptureFixture) -> None:
    with private_redis() as server, partitions(count), caplog.at_level(logging.INFO, logger="carmy.queue"):
        proxy = CuttableProxy(server.port)
        await proxy.start()
        try:
            async with worker_in_process(proxy.url, "w-outage") as held:
                turns = 0
                start_due = held.worker._start_due

                async def counted(taken: Any) -> int:
                    nonlocal turns
                    turns += 1
                    return await start_due(taken)

                held.worker._start_due = counted  # type: ignore[method-assign]
                held.run()
                try:
                    await wait_until_async(lambda: turns >= 2, WAIT_S, "the worker's loop turning")
                    proxy.cut()
                    down_at = turns
                    await wait_until_async(lambda: turns >= down_at + TURNS_DOWN, WAIT_S, "the loop retrying")
                    assert said(caplog, "queue unreachable") == 1
                    assert said(caplog, "queue reachable again") == 0
                    proxy.restore()
                    await wait_until_async(lambda: said(caplog, "queue reachable again") == 1, WAIT_S,
                                           "the loop's line once Redis answers")
                    assert said(caplog, "queue unreachable") == 1
                finally:
                    proxy.restore()  # as it was, whatever failed, for the worker's close
        finally:
            await proxy.close()
