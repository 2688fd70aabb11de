"""Request log lines written together a little later (``api/endpoints/deferred.py``): never lost,
never more than ``MAX_DELAY_S`` late, and written at the app's shutdown."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from api.endpoints import deferred
from api.endpoints.deferred import Deferred
from api.settings import ApiSettings
from tests.conftest import app_client


def request_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.carmy for r in caplog.records if getattr(r, "carmy", {}).get("event") == "request"]


async def test_deferred_work_runs_together_in_order_within_the_delay() -> None:
    done: list[int] = []
    later = Deferred()
    loop = asyncio.get_running_loop()
    began = loop.time()
    for n in range(3):
        later.defer(done.append, n)
    assert done == []  # not in the turn that deferred it
    ran = loop.create_future()
    later.defer(ran.set_result, None)
    await asyncio.wait_for(ran, 1.0)
    assert done == [0, 1, 2]
    assert loop.time() - began < deferred.MAX_DELAY_S + 0.5  # its timer, not a later one


async def test_run_does_it_now_and_an_error_stops_nothing_else() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        done: list[str] = []
        later = Deferred()
        later.defer(done.append, "a")
        later.defer(lambda: 1 / 0)
        later.defer(done.append, "b")
        later.run()
        assert done == ["a", "b"]
        assert [type(c["exception"]) for c in reported] == [ZeroDivisionError]
        later.run()  # nothing left: nothing runs twice
        assert done == ["a", "b"]
    finally:
        loop.set_exception_handler(None)


async def test_a_request_is_logged_once_answered(api_settings: ApiSettings,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="carmy.api")
    async with app_client(api_settings) as client:
        r = await client.post("/agent/execute", json={"tool": "no-such-tool", "arguments": {}})
        assert r.status_code == 404
        for _ in range(100):  # the line waits at most MAX_DELAY_S for the others
            if request_lines(caplog):
                break
            await asyncio.sleep(deferred.MAX_DELAY_S)
    [line] = request_lines(caplog)
    assert (line["outcome"], line["status_code"], line["error_code"]) == ("refused", 404, "TOOL_NOT_FOUND")
    assert line["duration_ms"] >= 0


async def test_the_app_writes_the_lines_still_waiting_as_it_stops(api_settings: ApiSettings,
                                                                  caplog: pytest.LogCaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.INFO, logger="carmy.api")
    monkeypatch.setattr(deferred, "MAX_DELAY_S", 3600.0)  # only the shutdown can write it
    async with app_client(api_settings) as client:
        r = await client.post("/agent/execute", json={"tool": "no-such-tool", "arguments": {}})
        assert r.status_code == 404
        assert request_lines(caplog) == []
    assert [line["outcome"] for line in request_lines(caplog)] == ["refused"]
