"""Which quota applies to which principal (README, "Per-principal quotas").

Every principal gets the default limits (``CARMY_QUOTA_PENDING``, ``CARMY_QUOTA_RATE``,
``CARMY_QUOTA_BURST``); ``CARMY_QUOTAS`` overrides them for named principals, field by field.
A principal is whatever authentication trusted: an API key's ``principal``, or an access
token's ``sub`` (or ``CARMY_OAUTH_PRINCIPAL_CLAIM``); so several keys that name one principal
share its quota. Without authentication, every caller is the same (anonymous) principal.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from msgspec import Struct

from carmy_worker.settings import SettingsError, env_float, env_int
from carmy_worker.store.quota import NO_QUOTA, Quota


class QuotaOverride(Struct, frozen=True, forbid_unknown_fields=True):
    """One principal's limits in ``CARMY_QUOTAS``; a field left out keeps the default's, 0 lifts it."""

    pending: int | None = None
    rate: float | None = None
    burst: int | None = None


class Quotas(Struct, frozen=True):
    """The default quota, and the principals whose limits differ."""

    default: Quota = NO_QUOTA
    overrides: dict[str, Quota] = {}

    def of(self, principal: str | None) -> Quota:
        """The limits of ``principal`` (None: an unauthenticated caller)."""
        if principal is not None and principal in self.overrides:
            return self.overrides[principal]
        return self.default


def quotas_from_env(env: Mapping[str, str]) -> Quotas:
    default = Quota(
        pending=env_int(env, "CARMY_QUOTA_PENDING", 0, minimum=0),
        rate=env_float(env, "CARMY_QUOTA_RATE", 0.0, zero_ok=True),
        burst=env_int(env, "CARMY_QUOTA_BURST", 0, minimum=0),
    )
    return Quotas(default, parse_overrides(env.get("CARMY_QUOTAS"), default))


def parse_overrides(raw: str | None, default: Quota) -> dict[str, Quota]:
    """``{"<principal>": {"pending": 5, "rate": 2.5, "burst": 10}}``; empty when unset."""
    if raw is None or raw.strip() == "":
        return {}
    try:
        overrides = msgspec.json.decode(raw, type=dict[str, QuotaOverride])
    except msgspec.DecodeError as exc:
        raise SettingsError(f"CARMY_QUOTAS is not valid: {exc}") from None
    quotas = {}
    for principal, override in overrides.items():
        quota = Quota(
            pending=default.pending if override.pending is None else override.pending,
            rate=default.rate if override.rate is None else override.rate,
            burst=default.burst if override.burst is None else override.burst,
        )
        if quota.pending < 0 or quota.rate < 0 or quota.burst < 0 or quota.rate == float("inf"):
            raise SettingsError(f"CARMY_QUOTAS: the limits of {principal!r} must be at least 0")
        quotas[principal] = quota
    return quotas
