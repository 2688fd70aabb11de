"""OAuth 2.1 resource server: JWT access tokens of one configured issuer stand for callers,
besides API keys.

* ``settings``: ``OAuthSettings`` (``CARMY_OAUTH_*``);
* ``keys``: the issuer's public keys, fetched (cached, refreshed on rotation, rate-limited) or
  read from a file;
* ``tokens``: a token to an ``AgentContext`` (principal from ``sub``, permissions from ``scope``),
  or a ``Refusal``;
* ``metadata``: Protected Resource Metadata (RFC 9728), served and named in challenges.
"""

from api.guards.oauth.keys import RemoteKeys, StaticKeys
from api.guards.oauth.metadata import ProtectedResources
from api.guards.oauth.tokens import Refusal, TokenVerifier
from api.settings.oauth import OAuthSettings
from carmy_worker.settings import SettingsError


def key_source(settings: OAuthSettings) -> RemoteKeys | StaticKeys:
    """The key set the settings name: a file is read now (a ``SettingsError`` if unusable)."""
    if settings.jwks_file is not None:
        return StaticKeys(settings.jwks_file)
    if settings.jwks_url is not None:
        return RemoteKeys(settings.jwks_url, max_age=settings.jwks_max_age, min_refresh=settings.jwks_min_refresh)
    raise SettingsError("OAuth needs CARMY_OAUTH_JWKS_URL or CARMY_OAUTH_JWKS_FILE")


__all__ = ["OAuthSettings", "ProtectedResources", "Refusal", "RemoteKeys", "StaticKeys", "TokenVerifier",
           "key_source"]
