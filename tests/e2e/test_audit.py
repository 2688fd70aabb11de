"""The audit trail through real processes: two ``python -m api`` with ``CARMY_AUDIT_SINK`` on the
same file, and a worker of ``tests.toolsets.jobs``. One call through each door (HTTP JSON, SSE,
MCP's ``tools/call``, a job's attempt, a webhook delivery, and a replay of the first) leaves
exactly one entry each, with its door, tool, status, caller and request id; the sinks of the two
APIs write every entry once between them; no entry, line or answer holds the arguments."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from carmy_worker.store import keys
from carmy_worker.store.jobstore import FINISHED
from carmy_worker.store.shipment import GROUP
from tests.api.test_webhooks import ENV, WEBHOOKS, github
from tests.sse import parse
from tests.support import Stack, mcp_message, wait_until

ALICE, OPS = "alice-token-0123456789", "ops-token-0123456789ab"
KEYS = json.dumps({ALICE: {"principal": "alice"}, OPS: {"principal": "ops", "permissions": ["carmy:operator"]}})
AS_ALICE = {"authorization": f"Bearer {ALICE}"}
AS_OPS = {"authorization": f"Bearer {OPS}"}
# In every call's arguments: it must never reach the trail, a sink's line or an audit answer.
MARKER = f"audit-marker-{uuid.uuid4().hex}"


@dataclass
class Apis:
    bases: list[str]
    sink: Path
    client: httpx.Client
    redis_url: str

    def execute(self, base: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
        return self.client.post(base + "/agent/execute", json=body, headers={**AS_ALICE, **(headers or {})})

    def trail(self) -> list[dict[str, Any]]:
        """Every entry, newest first, through one API's GET /agent/audit, page after page."""
        entries: list[dict[str, Any]] = []
        cursor = None
        while True:
            r = self.client.get(self.bases[0] + "/agent/audit", headers=AS_OPS,
                                params={"limit": 500, **({"cursor": cursor} if cursor else {})})
            assert r.status_code == 200, r.text
            assert MARKER not in r.text
            entries += r.json()["entries"]
            if (cursor := r.json()["next_cursor"]) is None:
                return entries

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.sink.read_text().splitlines()] if self.sink.exists() else []


@pytest.fixture(scope="module")
def apis(stack: Stack) -> Iterator[Apis]:
    stack.worker("tests.toolsets.jobs")
    sink = stack.tmp / "audit.jsonl"
    env = {"CARMY_API_KEYS": KEYS, "CARMY_WEBHOOKS": json.dumps({"gh": WEBHOOKS["gh"]}),
           "CARMY_AUDIT_SINK": f"file:{sink}", **ENV}
    bases = [stack.api(env)[1], stack.api(env)[1]]
    with httpx.Client(timeout=30) as client:
        for base in bases:
            wait_until(lambda b=base: "stamp" in client.get(b + "/agent/tools", headers=AS_OPS).text)  # type: ignore[misc]
        yield Apis(bases, sink, client, stack.redis_url)


def work(door: str) -> dict[str, Any]:
    return {"name": f"{MARKER}-{door}"}


def by_http(apis: Apis) -> str:
    r = apis.execute(apis.bases[0], {"tool": "stamp", "arguments": work("http"), "request_id": "audit-http"})
    assert r.status_code == 200 and r.json()["status"] == "completed", r.text
    exec_id: str = r.json()["execution_id"]
    return exec_id


def by_sse(apis: Apis) -> str:
    r = apis.execute(apis.bases[1], {"tool": "stamp", "arguments": work("sse"), "request_id": "audit-sse"},
                     {"accept": "text/event-stream"})
    final = dict(parse(r.text))["execution.completed"]
    assert final["status"] == "completed", r.text
    exec_id: str = final["execution_id"]
    return exec_id


def by_mcp(apis: Apis) -> str:
    r = apis.client.post(apis.bases[0] + "/mcp", headers={**AS_ALICE, "accept": "application/json, text/event-stream",
                                                          "mcp-protocol-version": "2025-11-25"}, json={
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "stamp", "arguments": work("mcp"), "_meta": {"carmy/request_id": "audit-mcp"}}})
    assert r.status_code == 200, r.text
    message = mcp_message(r)
    assert message["result"]["isError"] is False, message
    exec_id: str = message["result"]["_meta"]["carmy/execution_id"]
    return exec_id


def by_job(apis: Apis) -> tuple[str, str]:
    r = apis.client.post(apis.bases[1] + "/agent/jobs", headers=AS_ALICE,
                         json={"tool": "stamp", "arguments": work("job"), "request_id": "audit-job"})
    assert r.status_code == 202, r.text
    job_id: str = r.json()["job_id"]
    job: dict[str, Any] = wait_until(  # type: ignore[assignment]
        lambda: (j := apis.client.get(f"{apis.bases[1]}/agent/jobs/{job_id}", headers=AS_ALICE).json())["status"]
        in FINISHED and j, what="the job finished")
    assert job["status"] == "succeeded" and len(job["executions"]) == 1, job
    return job_id, job["executions"][0]


def by_webhook(apis: Apis) -> tuple[str, str]:
    event = f"evt-{uuid.uuid4()}"
    body = json.dumps(work("webhook")).encode()
    r = apis.client.post(apis.bases[0] + "/agent/webhooks/gh", content=body, headers=github(body, delivery=event))
    assert r.status_code == 200 and r.json()["status"] == "completed", r.text
    return event, r.json()["execution_id"]


def test_each_door_leaves_one_entry_and_each_entry_is_shipped_once(apis: Apis) -> None:
    http, sse, mcp = by_http(apis), by_sse(apis), by_mcp(apis)
    job_id, job_exec = by_job(apis)
    event, hooked = by_webhook(apis)
    replay = apis.execute(apis.bases[1], {"tool": "stamp", "arguments": work("http"), "request_id": "audit-http"})
    assert replay.json()["execution_id"] == http  # the recorded answer again, byte for byte

    entries = apis.trail()
    mine = {http, sse, mcp, job_exec, hooked}
    seen = Counter((e["execution_id"], e["replayed"]) for e in entries)
    assert {key: n for key, n in seen.items() if key[0] in mine} == {
        (http, False): 1, (http, True): 1, (sse, False): 1, (mcp, False): 1, (job_exec, False): 1, (hooked, False): 1}

    def entry(exec_id: str, replayed: bool = False) -> dict[str, Any]:
        [found] = [e for e in entries if e["execution_id"] == exec_id and e["replayed"] is replayed]
        return {k: found[k] for k in ("via", "tool", "status", "principal", "request_id", "job_id")}

    alice = {"tool": "stamp", "status": "completed", "principal": "alice", "job_id": None}
    assert entry(http) == {**alice, "via": "http", "request_id": "audit-http"}
    assert entry(http, replayed=True) == {**alice, "via": "http", "request_id": "audit-http"}
    assert entry(sse) == {**alice, "via": "sse", "request_id": "audit-sse"}
    assert entry(mcp) == {**alice, "via": "mcp", "request_id": "audit-mcp"}
    assert entry(job_exec) == {**alice, "via": "job", "request_id": "audit-job", "job_id": job_id}
    assert entry(hooked) == {**alice, "via": "webhook", "principal": "webhook:gh", "request_id": event}

    # The sinks: every entry of the trail written once, by one API or the other.
    ids = {e["id"] for e in entries}
    wait_until(lambda: ids <= {line["id"] for line in apis.lines()}, what="every entry shipped")
    lines = apis.lines()
    assert all(n == 1 for n in Counter(line["id"] for line in lines).values())
    per_execution = Counter(line["execution_id"] for line in lines)
    assert {e: per_execution[e] for e in mine} == {http: 2, sse: 1, mcp: 1, job_exec: 1, hooked: 1}
    assert {line["id"]: line for line in lines if line["id"] in ids} == {e["id"]: e for e in entries}  # same fields
    assert MARKER not in apis.sink.read_text()


def test_a_burst_through_both_apis_is_shipped_once_each(apis: Apis) -> None:
    made = [apis.execute(apis.bases[i % 2], {"tool": "stamp", "arguments": {"name": f"burst-{i}"}}).json()
            for i in range(40)]
    exec_ids = {m["execution_id"] for m in made}
    wait_until(lambda: exec_ids <= {line["execution_id"] for line in apis.lines()}, what="the burst shipped")
    per_execution = Counter(line["execution_id"] for line in apis.lines())
    assert {e: per_execution[e] for e in exec_ids} == {e: 1 for e in exec_ids}
    # Both processes shipped some: each is a consumer of the group, which Redis makes of a
    # process when it is first given an entry (blocked readers are served in turn).
    client = redis.Redis.from_url(apis.redis_url)
    try:
        consumers = [c for n in keys.partitions() for c in client.xinfo_consumers(keys.audit(n), GROUP)]
    finally:
        client.close()
    assert len({c["name"] for c in consumers}) == 2 and all(c["pending"] == 0 for c in consumers), consumers
