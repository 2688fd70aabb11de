"""Calls while one primary of a 16-partition cluster hangs (stopped: it takes connections in and
answers nothing) and is not failed over, through the real API and worker processes: a worker
runs the calls of the partitions on the other primaries promptly (README, "What a failover can
lose").

Before, a worker's LEASE outside its wait for work (a freed slot's, or one where a reply said work
was due) had no reply timeout: once one went to the hung primary, the worker's loop waited there
(in the connection's handshake, or for the reply) until the node woke, and every call it had
accepted elsewhere stayed ``queued``."""

from __future__ import annotations

import functools
import time
import uuid
from pathlib import Path

import httpx
import pytest
from redis.crc import key_slot

from bench.localcluster import LocalCluster
from carmy_worker.store import keys
from tests.cells import partitions
from tests.cluster.conftest import PARTITIONS_BESIDE_A_FAULT as PARTITIONS
from tests.cluster.conftest import ClusterStack
from tests.support import wait_until

pytestmark = pytest.mark.slow

CALLS = 24
# Far under the failover this cluster never makes, and under what a worker stuck on the hung node
# until it woke would take; generous for a busy 2-core machine.
PROMPTLY_S = 5.0


def started_at(tmp: Path, tag: str) -> float | None:
    """When ``linger`` with ``tag`` started (its worker's clock, this machine's), if it did."""
    path = tmp / f"linger-start-{tag}"
    text = path.read_text() if path.exists() else ""
    return float(text.splitlines()[0]) if text.endswith("\n") else None


def ended(client: httpx.Client, exec_id: str) -> str | None:
    """The status of an execution that has ended, None while it is queued or running."""
    status = client.get(f"/agent/executions/{exec_id}").json()["status"]
    return None if status in {"queued", "running"} else str(status)


@pytest.mark.timeout(180)  # a cluster of its own to start, and a second for each call refused
def test_a_worker_runs_the_calls_of_the_primaries_still_up_promptly_while_another_hangs(
        slow_to_fail_over: LocalCluster, stack_beside_a_fault: ClusterStack) -> None:
    cluster, stack = slow_to_fail_over, stack_beside_a_fault
    # Two slots: they free up often, and each freed slot's LEASE goes to the next partition in
    # turn, the hung primary's among them.
    stack.worker(env={"CARMY_CONCURRENCY": "2"})
    _, base = stack.api()
    wait_until(lambda: httpx.get(base + "/ready").status_code == 200, what="API ready")
    with partitions(PARTITIONS):
        owners = {p: cluster.owner(key_slot(keys.partition_prefix(p).encode())) for p in keys.partitions()}
    victim = owners[0]
    accepted: dict[str, tuple[str, float]] = {}  # tag -> (execution id, when accepted)
    refused = set()
    victim.pause()
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            while len(accepted) < CALLS:
                tag = uuid.uuid4().hex[:8]
                r = client.post("/agent/execute", json={"tool": "linger", "arguments": {"seconds": 0.2, "tag": tag}},
                                headers={"prefer": "respond-async"})
                if r.status_code == 202:
                    accepted[tag] = (r.json()["execution_id"], time.time())
                else:
                    refused.add((r.status_code, r.json()["error"]["code"]))
            wait_until(lambda: all(started_at(stack.tmp, tag) for tag in accepted), timeout=30,
                       what="every accepted call started")
            statuses = [wait_until(functools.partial(ended, client, exec_id), what="the call ended")
                        for exec_id, _ in accepted.values()]
    finally:
        victim.resume()
    assert statuses == ["completed"] * CALLS
    assert refused <= {(503, "STORE_UNAVAILABLE")}, refused
    with partitions(PARTITIONS):
        assert not {keys.partition_of(exec_id) for exec_id, _ in accepted.values()} & {
            p for p, owner in owners.items() if owner is victim}
    waited = {tag: started_at(stack.tmp, tag) - at for tag, (_, at) in accepted.items()}  # type: ignore[operator]
    assert max(waited.values()) < PROMPTLY_S, sorted(waited.values())
