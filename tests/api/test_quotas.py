"""CARMY_QUOTA_* and CARMY_QUOTAS: which limits each principal gets, and the settings refused at start."""

from __future__ import annotations

import pytest

from api.settings import ApiSettings
from api.settings.quotas import Quotas
from carmy_worker.settings import SettingsError
from carmy_worker.store.quota import NO_QUOTA, Quota


def test_off_by_default() -> None:
    quotas = ApiSettings.from_env({}).quotas
    assert quotas == Quotas() and quotas.of("alice") == quotas.of(None) == NO_QUOTA
    assert NO_QUOTA.pending == 0 and NO_QUOTA.rate == 0


def test_a_default_for_everyone_and_overrides_field_by_field() -> None:
    quotas = ApiSettings.from_env({
        "CARMY_QUOTA_PENDING": "10", "CARMY_QUOTA_RATE": "2.5", "CARMY_QUOTA_BURST": "5",
        "CARMY_QUOTAS": '{"batch": {"pending": 50, "rate": 0}, "trial": {"rate": 0.1, "burst": 1}}',
    }).quotas
    assert quotas.of("alice") == quotas.of(None) == Quota(pending=10, rate=2.5, burst=5)
    assert quotas.of("batch") == Quota(pending=50, rate=0, burst=5)  # 0 lifts the default's rate
    assert quotas.of("trial") == Quota(pending=10, rate=0.1, burst=1)


def test_the_bucket_in_microseconds() -> None:
    assert (Quota(rate=4, burst=3).interval_us(), Quota(rate=4, burst=3).tolerance_us()) == (250_000, 500_000)
    assert Quota(rate=2.5).tolerance_us() == 2 * 400_000  # burst by default: one second's worth, 3
    assert Quota(rate=0.2).tolerance_us() == 0  # at least one call at once
    assert Quota(pending=3).interval_us() == 0


@pytest.mark.parametrize("env", [
    {"CARMY_QUOTA_PENDING": "-1"},
    {"CARMY_QUOTA_RATE": "-1"},
    {"CARMY_QUOTA_RATE": "inf"},
    {"CARMY_QUOTA_RATE": "nan"},
    {"CARMY_QUOTA_RATE": "fast"},
    {"CARMY_QUOTA_BURST": "-2"},
    {"CARMY_QUOTAS": "{not json"},
    {"CARMY_QUOTAS": '{"alice": {"pending": -1}}'},
    {"CARMY_QUOTAS": '{"alice": {"concurrency": 3}}'},
])
def test_refused_at_start(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        ApiSettings.from_env(env)
