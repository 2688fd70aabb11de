"""Which faults a run may play: the single Redis's restarts, or a Sentinel group's failover."""

from __future__ import annotations

from itertools import islice

from chaos.faults import default_kinds, refusal, schedule
from chaos.model import FAULT_KINDS


def test_the_default_faults_follow_the_redis_of_the_run() -> None:
    single, sentinel = default_kinds(sentinel=False), default_kinds(sentinel=True)
    assert "redis-failover" not in single and {"redis-term", "redis-kill"} <= set(single)
    assert "redis-failover" in sentinel and not {"redis-term", "redis-kill"} & set(sentinel)
    assert set(single) | set(sentinel) == set(FAULT_KINDS)


def test_faults_the_redis_cannot_take_are_refused_with_the_way_out() -> None:
    assert refusal(["redis-failover", "worker-kill"], sentinel=True) is None
    assert refusal(["redis-kill", "overload"], sentinel=False) is None
    assert refusal([], sentinel=True) is None
    assert "--sentinel" in (refusal(["redis-failover"], sentinel=False) or "")
    assert "redis-failover" in (refusal(["redis-kill"], sentinel=True) or "")
    assert refusal(["redis-nap"], sentinel=True) == "unknown faults: redis-nap"


def test_every_kind_comes_once_before_any_comes_again() -> None:
    kinds = default_kinds(sentinel=True)
    first = [kind for kind, _ in islice(schedule(kinds, seed=1), len(kinds))]
    assert sorted(first) == sorted(kinds)
