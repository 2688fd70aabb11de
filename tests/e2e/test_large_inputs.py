"""One caller's large input costs that caller, not everyone: a big argument is checked in time
that grows with its size only, while other requests go on; and no answer or log line repeats
more than a few hundred characters of whatever a caller sent."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support import Proc, Stack, wait_until

KB = 1024


@pytest.fixture(scope="module")
def api(stack: Stack) -> tuple[Proc, str]:
    stack.worker()
    proc, base = stack.api()
    wait_until(lambda: "tree_size" in httpx.get(base + "/agent/tools").text)
    return proc, base


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return kb / 1024


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def binary_tree(size: int, leaf: Any) -> tuple[dict[str, Any], int]:
    """A balanced tree of ``tree_size``'s recursive input type, grown breadth first until its
    JSON is about ``size`` bytes, with ``leaf`` as the value of its leaves; and its node count."""
    root: dict[str, Any] = {"value": 1}
    frontier, nodes = [root], 1
    while nodes * 19 < size:
        node = frontier.pop(0)
        node["children"] = [{"value": leaf}, {"value": leaf}]
        frontier += node["children"]
        nodes += 2
    return root, nodes


def test_a_large_recursive_argument_does_not_hold_up_other_requests(api: tuple[Proc, str]) -> None:
    proc, base = api
    valid, nodes = binary_tree(480 * KB, 1)
    invalid, _ = binary_tree(480 * KB, "one")  # every leaf is wrong
    bodies = [compact({"tool": "tree_size", "arguments": args}) for args in (valid, invalid) * 2]
    assert all(len(body) > 400 * KB for body in bodies)
    before = rss_mb(proc.pid)
    health: list[float] = []
    with ThreadPoolExecutor(len(bodies)) as pool, httpx.Client(timeout=60) as client:
        start = time.monotonic()
        calls = [pool.submit(httpx.post, base + "/agent/execute", content=body, timeout=60) for body in bodies]
        while not all(call.done() for call in calls):
            asked = time.monotonic()
            assert client.get(base + "/health").status_code == 200
            health.append(time.monotonic() - asked)
        answered = time.monotonic() - start
        answers = [call.result() for call in calls]
    assert [a.status_code for a in answers] == [200, 400] * 2
    assert answers[0].json()["data"] == {"n": nodes}
    error = answers[1].json()["error"]
    assert error["code"] == "INVALID_ARGUMENTS"
    assert error["details"]["path"].startswith("$.children[")
    # Checked in milliseconds each (a pure-Python validator took seconds for each of these,
    # and /health waited behind them): generous bounds, for a busy machine.
    assert answered < 5.0
    assert max(health) < 3.0
    assert rss_mb(proc.pid) - before < 50
