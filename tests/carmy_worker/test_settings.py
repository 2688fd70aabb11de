"""WorkerSettings.from_env: the README's worker settings."""

from __future__ import annotations

import pytest

from carmy_worker.settings import SettingsError, WorkerSettings


def test_max_result_bytes_defaults_to_one_mebibyte() -> None:
    assert WorkerSettings.from_env({}).max_result_bytes == 1_048_576
    assert WorkerSettings.from_env({"CARMY_MAX_RESULT_BYTES": "65536"}).max_result_bytes == 65536


@pytest.mark.parametrize("raw", ["0", "-1", "1MB"])
def test_max_result_bytes_must_be_a_positive_integer(raw: str) -> None:
    with pytest.raises(SettingsError, match="CARMY_MAX_RESULT_BYTES"):
        WorkerSettings.from_env({"CARMY_MAX_RESULT_BYTES": raw})
