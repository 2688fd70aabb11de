"""The issuer's key set: which keys are used, how often it is fetched (a clock of the test's
own), and a file instead of a URL."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest

from api.app import create_app
from api.guards.oauth import OAuthSettings, RemoteKeys, StaticKeys, TokenVerifier
from api.guards.oauth.keys import KeySet, Unavailable
from api.guards.oauth.tokens import TRUSTED_FOR_S, Refusal
from carmy_worker.sdk.context import AgentContext
from carmy_worker.settings import SettingsError
from tests.issuer import ISSUER, RESOURCE, issuing, new_key
from tests.support import app_settings


def test_a_key_serves_its_own_algorithm_only() -> None:
    rsa, ec = new_key("r"), new_key("e", "ES256")
    no_alg = {k: v for k, v in new_key("n").jwk().items() if k != "alg"}
    keys = KeySet({"keys": [rsa.jwk(), ec.jwk(), no_alg, {"kty": "oct", "kid": "h", "k": "c2VjcmV0"},
                            {**new_key("enc").jwk(), "use": "enc"}, {"kty": "nope", "kid": "x"}, "junk"]})
    assert len(keys) == 3  # no symmetric key, no encryption key, nothing unknown
    assert isinstance(keys.key("r", "RS256"), jwt.PyJWK)
    assert keys.key("r", "HS256") is None
    assert keys.key("r", "ES256") is None
    assert keys.key("e", "RS256") is None
    assert keys.key("h", "HS256") is None
    assert keys.key("n", "PS256") is not None  # an RSA key without alg: any RSA algorithm
    assert keys.key("n", "ES256") is None  # ... but not another family
    assert keys.key(None, "RS256") is None  # no kid: only when the set has a single key
    assert KeySet({"keys": [rsa.jwk()]}).key(None, "RS256") is not None


async def test_a_malformed_key_or_set_from_the_issuer_is_left_out_not_a_failure_of_every_check() -> None:
    """The JOSE library raises a TypeError, not a PyJWTError, for some malformed fields: such a
    key is left out like any it cannot use, and the set's other keys serve."""
    good = new_key("good")
    junk = [{**new_key("listed").jwk(), "alg": [1]}, {"kty": "RSA", "kid": "n", "n": 123, "e": "AQAB"},
            {"kty": "EC", "kid": "c", "crv": [], "x": "a", "y": "b"}]
    assert len(KeySet({"keys": [good.jwk(), *junk]})) == 1
    now = [0.0]
    with issuing(good) as issuer:
        issuer.extra = junk
        keys = RemoteKeys(issuer.jwks_url, max_age=100, min_refresh=10, clock=lambda: now[0])
        assert await keys.key("good", "RS256") is not None and await keys.key("listed", "RS256") is None
        # A set nested too deeply to parse is a failed fetch (the cached set stays), not an error.
        issuer.raw = b'{"keys": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        now[0] = 200.0
        assert await keys.key("good", "RS256") is not None
        assert issuer.hits == 2


def test_made_up_kids_are_not_remembered() -> None:
    """A kid comes from the token's unverified header: a set that remembered every one it was
    asked for would grow with each forged token (a key file's set lives as long as the process)."""
    keys = KeySet({"keys": [new_key("r").jwk()]})
    for i in range(1000):
        assert keys.key(f"made-up-{i}", "RS256") is None
    assert keys.key("r", "RS256") is not None
    assert len(keys._prepared) == 1


async def test_fetched_once_shared_refreshed_when_stale_or_unknown_at_most_every_min_refresh() -> None:
    old, new = new_key("old"), new_key("new")
    now = [0.0]
    with issuing(old) as issuer:
        keys = RemoteKeys(issuer.jwks_url, max_age=100, min_refresh=10, clock=lambda: now[0])
        assert await keys.key("old", "RS256") is not None
        assert await keys.key("old", "RS256") is not None
        assert issuer.hits == 1
        issuer.keys = [new]  # rotated
        assert await keys.key("new", "RS256") is None  # too soon after the last fetch
        now[0] = 10.0
        assert await keys.key("new", "RS256") is not None
        assert await keys.key("garbage", "RS256") is None
        assert issuer.hits == 2
        now[0] = 115.0  # stale: fetched again, and failing, the cached set stays
        issuer.status = 503
        assert await keys.key("new", "RS256") is not None
        assert issuer.hits == 3
        assert await keys.key("new", "RS256") is not None
        assert issuer.hits == 3  # a failed fetch is not retried before min_refresh either


async def test_unavailable_without_a_cached_set() -> None:
    now = [0.0]
    with issuing(new_key("k")) as issuer:
        issuer.status = 500
        keys = RemoteKeys(issuer.jwks_url, max_age=100, min_refresh=10, clock=lambda: now[0])
        assert await keys.key("k", "RS256") == Unavailable(retry_after=10)
        now[0] = 4.5
        assert await keys.key("k", "RS256") == Unavailable(retry_after=6)
        assert issuer.hits == 1
        issuer.status = 200
        now[0] = 10.0
        assert await keys.key("k", "RS256") is not None


async def test_a_key_file_and_a_principal_claim(tmp_path: Path) -> None:
    key = new_key("k", "ES256")
    with issuing(key) as issuer:
        path = tmp_path / "jwks.json"
        path.write_bytes(issuer.jwks_document())
        settings = OAuthSettings(issuer=ISSUER, resource=RESOURCE, jwks_file=str(path), principal_claim="email")
        verifier = TokenVerifier(settings, StaticKeys(str(path)))
        found = await verifier.verify(issuer.token(email="ann@example.test", scope=None, scp=["a", "b"]), (RESOURCE,))
        assert found == AgentContext(principal="ann@example.test", permissions=frozenset({"a", "b"}))
        refused = await verifier.verify(issuer.token(), (RESOURCE,))
        assert isinstance(refused, Refusal)
        assert refused.error == "invalid_token"
    assert issuer.hits == 0


async def test_a_valid_token_is_trusted_again_for_a_while_only(tmp_path: Path) -> None:
    with issuing(new_key("k")) as issuer:
        path = tmp_path / "jwks.json"
        path.write_bytes(issuer.jwks_document())
        now = [time.time()]
        verifier = TokenVerifier(OAuthSettings(issuer=ISSUER, resource=RESOURCE, jwks_file=str(path)),
                                 StaticKeys(str(path)), clock=lambda: now[0])
        token = issuer.token()
        first = await verifier.verify(token, (RESOURCE,))
        assert isinstance(first, AgentContext)
        assert await verifier.verify(token, (RESOURCE,)) == first
        assert verifier.checked == 1
        # For another audience, or changed by one byte, it is checked again (and refused).
        assert isinstance(await verifier.verify(token, ("https://other.test",)), Refusal)
        assert isinstance(await verifier.verify(token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1],
                                                (RESOURCE,)), Refusal)
        assert verifier.checked == 3
        now[0] += TRUSTED_FOR_S
        assert await verifier.verify(token, (RESOURCE,)) == first
        assert verifier.checked == 4
        # Never past its exp (+ leeway), however recently it was checked.
        short = issuer.token(exp=int(now[0]) + 5)
        assert isinstance(await verifier.verify(short, (RESOURCE,)), AgentContext)
        now[0] += 36
        await verifier.verify(short, (RESOURCE,))
        assert verifier.checked == 6


@pytest.mark.parametrize("content", [b"", b"{}", b'{"keys": []}', b'{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}'])
def test_an_unusable_key_file_stops_the_start(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "jwks.json"
    path.write_bytes(content)
    settings = app_settings(oauth=OAuthSettings(issuer=ISSUER, resource=RESOURCE, jwks_file=str(path)))
    with pytest.raises(SettingsError, match="CARMY_OAUTH_JWKS_FILE"):
        create_app(settings)
