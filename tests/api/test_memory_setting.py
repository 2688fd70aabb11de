"""CARMY_REDIS_MEMORY_HEADROOM: the share of Redis's maxmemory kept for calls already accepted."""

from __future__ import annotations

import pytest

from api.settings import ApiSettings
from carmy_worker.settings import SettingsError


def test_the_headroom_is_a_fraction_of_maxmemory() -> None:
    assert ApiSettings.from_env({}).redis_memory_headroom == 0.1
    assert ApiSettings.from_env({"CARMY_REDIS_MEMORY_HEADROOM": "0"}).redis_memory_headroom == 0
    assert ApiSettings.from_env({"CARMY_REDIS_MEMORY_HEADROOM": "0.25"}).redis_memory_headroom == 0.25
    for wrong in ("1", "1.5", "-0.1", "10%", "nan"):
        with pytest.raises(SettingsError, match="CARMY_REDIS_MEMORY_HEADROOM"):
            ApiSettings.from_env({"CARMY_REDIS_MEMORY_HEADROOM": wrong})
