"""DueHints: where a worker over several partitions sends a freed slot's LEASE (store/hints.py)."""

from __future__ import annotations

from carmy_worker.store.hints import DueHints

QUEUES = ["q0", "q1", "q2", "q3"]


def test_work_known_due_is_found_in_turn_from_the_start_given() -> None:
    hints = DueHints()
    assert hints.with_work(QUEUES, 0) is None  # nothing known: the worker waits on every partition
    hints.seen("q1", 2)
    hints.seen("q3", 1)
    hints.seen("q0", 0)
    assert hints.with_work(QUEUES, 0) == 1
    assert hints.with_work(QUEUES, 2) == 3
    assert hints.with_work(QUEUES, 0) == 1  # a look changes nothing
    hints.seen("q1", 0)
    hints.seen("q3", 0)
    assert hints.with_work(QUEUES, 0) is None


def test_a_partition_known_empty_is_passed_over_once_then_looked_at_again() -> None:
    hints = DueHints()
    assert hints.maybe_work(QUEUES, 2) == 2  # not known: maybe
    hints.seen("q2", 0)
    hints.seen("q3", 0)
    assert hints.maybe_work(QUEUES, 2) == 0  # q2 and q3 passed over...
    assert hints.maybe_work(QUEUES, 2) == 2  # ...once: a job may have come there since
    for queue in QUEUES:
        hints.seen(queue, 0)
    assert hints.maybe_work(QUEUES, 1) is None  # every one known empty: no LEASE
    assert hints.maybe_work(QUEUES, 1) == 1  # and the next pass looks again


def test_the_last_count_seen_is_what_counts() -> None:
    hints = DueHints()
    hints.seen("q0", 5)
    hints.seen("q0", 0)
    assert hints.with_work(QUEUES, 0) is None and hints.maybe_work(QUEUES, 0) == 1


def test_a_queue_not_usable_is_passed_over_as_it_is() -> None:
    """A partition whose last LEASE failed (``Leases.answering``) gets no LEASE outside the waits:
    it is passed over, what is known of it kept for when it answers again."""
    hints = DueHints()
    hints.seen("q1", 2)
    hints.seen("q2", 0)
    hints.seen("q3", 1)
    usable = lambda queue: queue != "q1"  # noqa: E731
    assert hints.with_work(QUEUES, 0, usable) == 3
    assert hints.maybe_work(QUEUES, 1, usable) == 3  # q1 passed over, q2 known empty (now not known)
    assert hints.maybe_work(QUEUES, 1, lambda queue: False) is None
    assert hints.with_work(QUEUES, 0) == 1 and hints.maybe_work(QUEUES, 1) == 1  # q1's count kept
