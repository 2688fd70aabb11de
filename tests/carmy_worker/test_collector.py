"""The collector of a serving process: young collections every YOUNG allocations, start-up
objects frozen out of them."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from carmy_worker import collector


@pytest.fixture
def restored() -> Iterator[None]:
    """The collector's settings as the test found them, nothing frozen meanwhile: the session
    froze what collection made (tests/conftest.py), and freezes it again after."""
    threshold = gc.get_threshold()
    session_froze = gc.get_freeze_count() > 0
    gc.unfreeze()
    yield
    gc.set_threshold(*threshold)
    gc.unfreeze()
    if session_froze:
        gc.freeze()


@pytest.mark.usefixtures("restored")
def test_a_serving_process_collects_its_young_objects_less_often_and_not_its_start_up() -> None:
    older = gc.get_threshold()[1:]
    collector.for_serving()
    assert gc.get_threshold() == (collector.YOUNG, *older)
    assert gc.get_freeze_count() == 0
    collector.freeze_start_up()
    assert gc.get_freeze_count() > 0
