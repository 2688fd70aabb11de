"""The catalog follows the workers: a worker with other tools changes it, and its ETag."""

from __future__ import annotations

import httpx
import pytest

from tests.support import Stack, wait_until


def tool_names(base: str) -> set[str]:
    return {t["name"] for t in httpx.get(base + "/agent/tools").json()["tools"]}


@pytest.mark.slow
def test_catalog_changes_when_a_worker_with_other_tools_starts(stack: Stack) -> None:
    stack.worker()
    _, base = stack.api()
    wait_until(lambda: "echo" in tool_names(base))
    before = httpx.get(base + "/.well-known/agent").json()["tools_version"]
    etag_before = httpx.get(base + "/agent/tools").headers["etag"]
    assert "ping" not in tool_names(base)

    stack.worker("tests.toolsets.extra")
    wait_until(lambda: "ping" in tool_names(base))
    after = httpx.get(base + "/.well-known/agent").json()["tools_version"]
    assert after != before
    assert httpx.get(base + "/agent/tools").headers["etag"] == f'"{after}"'
    # The old ETag no longer matches.
    assert httpx.get(base + "/agent/tools", headers={"if-none-match": etag_before}).status_code == 200
    r = httpx.post(base + "/agent/execute", json={"tool": "ping"})
    assert r.status_code == 200
    assert r.json()["data"] == {"pong": True}
