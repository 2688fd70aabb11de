"""How a round of waits over several partitions shares out a worker's free slots: the claims made
in Lua never exceed them, and what is kept never exceeds them either (store/wakeups.py; the
workers themselves: tests/carmy_worker/runtime/test_served.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from carmy_worker.store.attempts import Claim
from carmy_worker.store.leases import Lease
from carmy_worker.store.wakeups import claim_shares, kept_and_surplus


@given(st.integers(0, 64), st.integers(1, 16))
def test_the_claims_of_a_round_are_the_free_slots_spread_as_evenly_as_can_be(free: int, count: int) -> None:
    shares = claim_shares(free, count)
    assert len(shares) == count and sum(shares) == free
    assert max(shares) - min(shares) <= 1
    assert shares == sorted(shares, reverse=True)  # the partition whose turn it is first


def test_fewer_slots_than_partitions_claim_in_the_first_ones_in_turn() -> None:
    assert claim_shares(1, 4) == [1, 0, 0, 0]
    assert claim_shares(6, 4) == [2, 2, 1, 1]


def lease(job_id: str, claimed: bool) -> Lease:
    return Lease(job_id, 0, f"w/1/{job_id}", b"job", 1, Claim("run", 1, 0) if claimed else None)


def test_a_round_keeps_every_claim_then_unclaimed_jobs_in_turn_up_to_its_slots() -> None:
    taken = [lease("a1", False), lease("a2", False), lease("b1", True), lease("c1", False), lease("d1", True)]
    kept, surplus = kept_and_surplus(taken, 3)
    assert [x.job_id for x in kept] == ["b1", "d1", "a1"]
    assert [x.job_id for x in surplus] == ["a2", "c1"]
    kept, surplus = kept_and_surplus(taken, 10)
    assert len(kept) == 5 and surplus == []
