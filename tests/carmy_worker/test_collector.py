"""The collector of a serving process: young collections every YOUNG allocations, start-up
objects frozen out of them."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from carmy_worker import collector


@pytest.fixture
def restored() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.set_threshold(*threshold)
    gc.unfreeze()


@pytest.mark.usefixtures("restored")
def test_a_serving_process_collects_its_young_objects_less_often_and_not_its_start_up() -> None:
    older = gc.get_threshold()[1:]
    collector.for_serving()
    assert gc.get_threshold() == (collector.YOUNG, *older)
    collector.freeze_start_up()
    assert gc.get_freeze_count() > 0
