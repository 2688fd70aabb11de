"""CARMY_REDIS_CONNECTIONS: one connection is the SUBMIT batch's, so a pool needs two."""

from __future__ import annotations

import pytest

from api.settings import ApiSettings
from carmy_worker.settings import SettingsError


def test_a_pool_of_one_connection_is_refused_at_start() -> None:
    with pytest.raises(SettingsError, match="CARMY_REDIS_CONNECTIONS must be at least 2"):
        ApiSettings.from_env({"CARMY_REDIS_CONNECTIONS": "1"})
    assert ApiSettings.from_env({"CARMY_REDIS_CONNECTIONS": "2"}).redis_connections == 2
