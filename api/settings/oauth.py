"""``CARMY_OAUTH_*``: which issuer's access tokens the API accepts, and how it checks them."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from msgspec import Struct

from carmy_worker.settings import MAX_SECONDS, SettingsError, env_float

# Asymmetric signatures only: a resource server holding a secret that verifies tokens could also
# mint them. Never taken from the token: its "alg" must be one of the configured ones.
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


class OAuthSettings(Struct, frozen=True, kw_only=True):
    """One issuer whose JWT access tokens stand for a caller, besides the API keys."""

    issuer: str  # the tokens' "iss", exactly; also the authorization server the metadata names
    resource: str  # this deployment's resource URI: tokens' "aud" must contain it
    jwks_url: str | None = None  # the issuer's key set, fetched over HTTP and cached
    jwks_file: str | None = None  # or a key set (JWKS JSON) read once at start
    algorithms: tuple[str, ...] = ASYMMETRIC
    leeway: float = 30.0  # seconds of clock skew allowed on exp and nbf
    principal_claim: str = "sub"
    scopes: tuple[str, ...] = ()  # scopes every token needs (and the metadata's scopes_supported)
    jwks_max_age: float = 600.0  # seconds a fetched key set is used before it is fetched again
    jwks_min_refresh: float = 10.0  # seconds between two fetches, whatever kid tokens name

    def __post_init__(self) -> None:
        if (self.jwks_url is None) == (self.jwks_file is None):
            raise SettingsError("OAuth needs exactly one of CARMY_OAUTH_JWKS_URL and CARMY_OAUTH_JWKS_FILE")
        if not self.algorithms or not set(self.algorithms) <= set(ASYMMETRIC):
            raise SettingsError(f"CARMY_OAUTH_ALGORITHMS must name some of {', '.join(ASYMMETRIC)} "
                                f"(asymmetric only), got {','.join(self.algorithms)!r}")
        for name, url in (("CARMY_OAUTH_RESOURCE", self.resource), ("CARMY_OAUTH_ISSUER", self.issuer),
                          ("CARMY_OAUTH_JWKS_URL", self.jwks_url)):
            if url is not None and not is_http_url(url):
                raise SettingsError(f"{name} must be an absolute http(s) URL without fragment, got {url!r}")
        if not self.principal_claim:
            raise SettingsError("CARMY_OAUTH_PRINCIPAL_CLAIM must not be empty")

    @property
    def canonical_resource(self) -> str:
        """``resource`` without a trailing slash, the form MCP clients send as ``resource``."""
        return self.resource.rstrip("/")


def is_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc) and not parts.fragment


def oauth_from_env(env: Mapping[str, str]) -> OAuthSettings | None:
    """The OAuth settings, or None when ``CARMY_OAUTH_ISSUER`` is unset (no other ``CARMY_OAUTH_*``
    may be set then: a half-configured issuer would silently accept API keys only)."""
    issuer = (env.get("CARMY_OAUTH_ISSUER") or "").strip()
    if not issuer:
        stray = sorted(k for k, v in env.items() if k.startswith("CARMY_OAUTH_") and v)
        if stray:
            raise SettingsError(f"{', '.join(stray)} set without CARMY_OAUTH_ISSUER")
        return None
    resource = (env.get("CARMY_OAUTH_RESOURCE") or "").strip()
    if not resource:
        raise SettingsError("CARMY_OAUTH_ISSUER needs CARMY_OAUTH_RESOURCE (this server's URL, the tokens' audience)")
    algorithms = tuple(a for a in (env.get("CARMY_OAUTH_ALGORITHMS") or "").replace(",", " ").split())
    return OAuthSettings(
        issuer=issuer,
        resource=resource,
        jwks_url=(env.get("CARMY_OAUTH_JWKS_URL") or "").strip() or None,
        jwks_file=(env.get("CARMY_OAUTH_JWKS_FILE") or "").strip() or None,
        algorithms=algorithms or ASYMMETRIC,
        leeway=env_float(env, "CARMY_OAUTH_LEEWAY", 30.0, zero_ok=True, maximum=MAX_SECONDS),
        principal_claim=(env.get("CARMY_OAUTH_PRINCIPAL_CLAIM") or "sub").strip(),
        scopes=tuple((env.get("CARMY_OAUTH_SCOPES") or "").split()),
        jwks_max_age=env_float(env, "CARMY_OAUTH_JWKS_MAX_AGE", 600.0, maximum=MAX_SECONDS),
        jwks_min_refresh=env_float(env, "CARMY_OAUTH_JWKS_MIN_REFRESH", 10.0, maximum=MAX_SECONDS),
    )
