"""One caller cannot bloat a worker or stall everyone's streams: a tool reporting progress in a
tight loop keeps its worker's memory bounded, and large results never travel whole through the
pub/sub connection an API process shares between all its callers."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from bench.processes import status_kib
from tests.sse import parse
from tests.support import Proc, Stack, wait_until

MODULE = "tests.toolsets.misbehaving"
MIB = 1024 * 1024
SSE = {"accept": "text/event-stream"}
# For this module, Redis drops any pub/sub subscriber with more than 256 KiB waiting to be sent,
# at once: one message of a few hundred KiB would cut the API's shared connection.
TIGHT_PUBSUB = "pubsub 262144 0 0"


@pytest.fixture(scope="module")
def tight_pubsub(stack: Stack) -> Iterator[None]:
    client = redis.Redis.from_url(stack.redis_url)
    before = client.config_get("client-output-buffer-limit")["client-output-buffer-limit"]
    client.config_set("client-output-buffer-limit", TIGHT_PUBSUB)
    yield
    client.config_set("client-output-buffer-limit", before)
    client.close()


@pytest.fixture(scope="module")
def worker(stack: Stack, tight_pubsub: None) -> Proc:
    return stack.worker(MODULE)


@pytest.fixture(scope="module")
def api(stack: Stack, worker: Proc) -> tuple[Proc, str]:
    proc, url = stack.api()
    wait_until(lambda: "flood" in httpx.get(url + "/agent/tools").text)
    return proc, url


def peak_rss(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM), in bytes: what a tight loop grew it to,
    even if it was given back since."""
    return status_kib(pid, "VmHWM") * 1024


def stream(base: str, tool: str, arguments: dict[str, Any]) -> list[tuple[str, Any]]:
    r = httpx.post(base + "/agent/execute", json={"tool": tool, "arguments": arguments}, headers=SSE, timeout=60)
    assert r.status_code == 200
    return parse(r.text)


def progress_of(events: list[tuple[str, Any]]) -> list[int]:
    return [data["progress"] for name, data in events if name == "tool.progress"]


@pytest.mark.parametrize("tool", ["flood", "flood_sync"])
def test_a_tool_flooding_progress_keeps_its_worker_small(api: tuple[Proc, str], worker: Proc, tool: str) -> None:
    before = peak_rss(worker.pid)
    events = stream(api[1], tool, {"n": 200_000})
    grown = peak_rss(worker.pid) - before
    # Unbounded, the 200 000 events waiting to be published grew it by 45 MiB (and the call took
    # over a minute, publishing them one by one); bounded, by less than 1 MiB.
    assert grown < 16 * MIB, f"the worker's peak memory grew by {grown / MIB:.0f} MiB"
    assert events[-1] == ("execution.completed", {
        "execution_id": events[0][1]["execution_id"], "status": "completed", "data": {"n": 200_000},
        "_agent": {"cacheable": True, "next_actions": []}, "replayed": False})
    progress = progress_of(events)
    assert progress == sorted(set(progress)) and progress[-1] == 200_000  # in order, with the newest
    assert [name for name, _ in events][-2] == "tool.completed"


def test_large_results_leave_other_streams_their_events(api: tuple[Proc, str]) -> None:
    proc, base = api
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        streams = [pool.submit(stream, base, "ticks", {"n": 20, "every": 0.05}) for _ in range(2)]
        bigs = [pool.submit(httpx.post, base + "/agent/execute", json={"tool": "big", "arguments": {}}, timeout=60)
                for _ in range(2)]
        for big in bigs:
            r = big.result()
            assert r.status_code == 200 and r.json()["data"] == "b" * (900 * 1024)
        for events in (s.result() for s in streams):
            assert progress_of(events) == list(range(1, 21))  # not one lost
            assert events[-1][1]["data"] == {"n": 20}
    # The API's one pub/sub connection never dropped: no 900 KiB message went through it.
    assert "connection lost" not in proc.output()
