"""Calls while one primary of a 16-partition cluster is dead and not yet replaced, through the real
API and worker processes: the partitions of the primaries still up go on answering; only the
dead one's calls are refused, retryably (README, "What a failover can lose").

Before, the API's event hub held one subscription set for all its shards: the dead node's lost
connection took down every partition's channel, which could not be subscribed again while that
node refused connections, and every new call, whatever its partition, was refused
``503 STORE_UNAVAILABLE`` until the replica was promoted."""

from __future__ import annotations

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

CALLS = 64


def test_the_partitions_of_the_primaries_still_up_answer_while_another_is_dead(
        slow_to_fail_over: LocalCluster, stack_beside_a_fault: ClusterStack) -> None:
    cluster, stack = slow_to_fail_over, stack_beside_a_fault
    stack.worker()
    _, base = stack.api()
    wait_until(lambda: httpx.get(base + "/ready").status_code == 200, what="API ready")
    with partitions(PARTITIONS):
        owners = {p: cluster.owner(key_slot(keys.partition_prefix(p).encode())) for p in keys.partitions()}
    victim = owners[0]
    dead = {p for p, owner in owners.items() if owner is victim}
    assert 0 < len(dead) < PARTITIONS
    victim.kill()  # never failed over within the test: it stays dead

    answers: list[tuple[int, str | None, str | None]] = []

    def answered_beside_it() -> bool:
        r = httpx.post(base + "/agent/execute", json={"tool": "echo", "arguments": {"text": "hi"}}, timeout=30)
        doc = r.json()
        answers.append((r.status_code, doc.get("error", {}).get("code"), doc.get("execution_id")))
        return sum(status == 200 for status, _, _ in answers) >= CALLS // 2

    # The calls are drawn at random over the partitions: most fall where the primaries are up.
    wait_until(answered_beside_it, timeout=120, what="calls answered in the partitions still up")
    assert {(status, code) for status, code, _ in answers} <= {(200, None), (503, "STORE_UNAVAILABLE")}
    with partitions(PARTITIONS):
        answered_in = {keys.partition_of(exec_id) for status, _, exec_id in answers if status == 200 and exec_id}
    assert answered_in and not answered_in & dead

