"""CARMY_OAUTH_*: the README's OAuth settings, and the ones refused at start."""

from __future__ import annotations

import pytest

from api.settings import ApiSettings
from api.settings.oauth import ASYMMETRIC, OAuthSettings, oauth_from_env
from carmy_worker.settings import SettingsError

BASE = {"CARMY_OAUTH_ISSUER": "https://issuer.test", "CARMY_OAUTH_RESOURCE": "https://carmy.test/",
        "CARMY_OAUTH_JWKS_URL": "https://issuer.test/jwks"}


def test_off_by_default() -> None:
    assert oauth_from_env({}) is None
    assert not ApiSettings.from_env({}).authenticates


def test_defaults() -> None:
    oauth = ApiSettings.from_env(BASE).oauth
    assert oauth is not None
    assert oauth.algorithms == ASYMMETRIC
    assert not any(alg.startswith("HS") for alg in oauth.algorithms)
    assert (oauth.leeway, oauth.principal_claim, oauth.scopes) == (30.0, "sub", ())
    assert (oauth.jwks_max_age, oauth.jwks_min_refresh) == (600.0, 10.0)
    assert oauth.canonical_resource == "https://carmy.test"


def test_every_setting() -> None:
    oauth = oauth_from_env({**BASE, "CARMY_OAUTH_ALGORITHMS": "ES256, EdDSA", "CARMY_OAUTH_LEEWAY": "0",
                            "CARMY_OAUTH_PRINCIPAL_CLAIM": "email", "CARMY_OAUTH_SCOPES": "carmy  tools",
                            "CARMY_OAUTH_JWKS_MAX_AGE": "60", "CARMY_OAUTH_JWKS_MIN_REFRESH": "2"})
    assert oauth == OAuthSettings(issuer="https://issuer.test", resource="https://carmy.test/",
                                  jwks_url="https://issuer.test/jwks", algorithms=("ES256", "EdDSA"), leeway=0.0,
                                  principal_claim="email", scopes=("carmy", "tools"), jwks_max_age=60.0,
                                  jwks_min_refresh=2.0)
    # 0 is a leeway however it is written; env_float takes it as a number, not as a string "0".
    for zero in ("0.0", "00", " 0 "):
        leeway = oauth_from_env({**BASE, "CARMY_OAUTH_LEEWAY": zero})
        assert leeway is not None and leeway.leeway == 0.0


@pytest.mark.parametrize(("change", "message"), [
    ({"CARMY_OAUTH_ALGORITHMS": "RS256,HS256"}, "asymmetric only"),
    ({"CARMY_OAUTH_ALGORITHMS": "none"}, "asymmetric only"),
    ({"CARMY_OAUTH_RESOURCE": ""}, "needs CARMY_OAUTH_RESOURCE"),
    ({"CARMY_OAUTH_RESOURCE": "carmy.test"}, "CARMY_OAUTH_RESOURCE must be an absolute"),
    ({"CARMY_OAUTH_RESOURCE": "https://carmy.test#x"}, "without fragment"),
    ({"CARMY_OAUTH_JWKS_URL": ""}, "exactly one of"),
    ({"CARMY_OAUTH_JWKS_FILE": "/keys.json"}, "exactly one of"),
    ({"CARMY_OAUTH_ISSUER": ""}, "set without CARMY_OAUTH_ISSUER"),
    ({"CARMY_OAUTH_LEEWAY": "-1"}, "CARMY_OAUTH_LEEWAY"),
])
def test_refused(change: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        ApiSettings.from_env({**BASE, **change})
