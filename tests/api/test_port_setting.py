"""CARMY_PORT: a port past 65535 is refused at start. asyncio takes it modulo 65536, so 70000
was served on 4464 without a word."""

from __future__ import annotations

import pytest

from api.settings import ApiSettings
from carmy_worker.settings import SettingsError


@pytest.mark.parametrize("port", ["65536", "70000", "99999999999999999999"])
def test_a_port_past_65535_is_refused_at_start(port: str) -> None:
    with pytest.raises(SettingsError, match=f"CARMY_PORT must be at most 65535, got {port}"):
        ApiSettings.from_env({"CARMY_PORT": port})


def test_every_port_up_to_65535_is_taken() -> None:
    assert ApiSettings.from_env({"CARMY_PORT": "65535"}).port == 65535
    assert ApiSettings.from_env({"CARMY_PORT": "0"}).port == 0
