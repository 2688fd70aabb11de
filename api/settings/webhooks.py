"""Webhooks the API receives (``CARMY_WEBHOOKS``; docs/protocol.md, "Webhooks in").

``{"<name>": {"tool": "...", "verify": {...} | "none", "event_id": "...", "mode": "call" | "job",
"arguments": "<JSON pointer>", "auth": "none" | "api-key"}}``, parsed once at start. A secret is
named, never inlined: ``secret_env`` (an environment variable) or ``secret_file`` (a path), read
here, at start, so that a missing one stops the API instead of refusing every delivery later.
The secret's value lives in a ``Secret``, whose repr never shows it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Struct

from carmy_worker import signatures
from carmy_worker.settings import SettingsError

NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # a webhook's name is a path segment of its URL
STANDARD_PREFIX = "whsec_"


class Secret:
    """A secret's bytes; its repr says nothing of them (settings may be printed or logged)."""

    __slots__ = ("value",)

    def __init__(self, value: bytes) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "Secret(<hidden>)"


class HmacSha256(Struct, frozen=True, forbid_unknown_fields=True, tag="hmac-sha256", tag_field="scheme"):
    """The hex HMAC-SHA256 of the raw body in ``header``, optionally ``sha256=``-prefixed (GitHub's)."""

    header: str = "X-Hub-Signature-256"
    secret_env: str | None = None
    secret_file: str | None = None


class StandardWebhooks(Struct, frozen=True, forbid_unknown_fields=True, tag="standard-webhooks",
                       tag_field="scheme"):
    """Standard Webhooks: ``webhook-id``, ``webhook-timestamp`` (within ``tolerance_s`` of now),
    ``webhook-signature`` (``v1,<base64>`` entries); the secret is ``whsec_<base64>``."""

    secret_env: str | None = None
    secret_file: str | None = None
    tolerance_s: Annotated[int, msgspec.Meta(ge=1)] = 300


class HeaderSecret(Struct, frozen=True, forbid_unknown_fields=True, tag="header-secret", tag_field="scheme"):
    """The shared secret itself, in ``header``."""

    header: str
    secret_env: str | None = None
    secret_file: str | None = None


Scheme = HmacSha256 | StandardWebhooks | HeaderSecret
Mode = Literal["call", "job"]


class WebhookConfig(Struct, frozen=True, forbid_unknown_fields=True):
    """One webhook as ``CARMY_WEBHOOKS`` declares it."""

    tool: str
    verify: Scheme | Literal["none"]
    event_id: str | None = None  # "/a/json/pointer" into the body, or a header's name
    mode: Mode = "call"
    arguments: str | None = None  # a JSON pointer to the part of the body that is the arguments
    auth: Literal["none", "api-key"] = "none"  # "api-key": the delivery must also carry a key


class Webhook(Struct, frozen=True):
    """A webhook ready to receive: its configuration and its secret, read at start."""

    name: str
    config: WebhookConfig
    secret: Secret | None = None  # None: "verify": "none"

    @property
    def path(self) -> str:
        return f"/agent/webhooks/{self.name}"


def parse_webhooks(raw: str | None, env: Mapping[str, str]) -> dict[str, Webhook]:
    """``CARMY_WEBHOOKS``, each webhook with its secret; empty when unset. A bad value is a
    ``SettingsError`` naming the webhook."""
    if raw is None or raw.strip() == "":
        return {}
    try:
        configs = msgspec.json.decode(raw, type=dict[str, msgspec.Raw])
    except msgspec.DecodeError as exc:
        raise SettingsError(f"CARMY_WEBHOOKS is not a JSON object: {exc}") from None
    return {name: webhook(name, config, env) for name, config in configs.items()}


def webhook(name: str, raw: msgspec.Raw, env: Mapping[str, str]) -> Webhook:
    where = f"CARMY_WEBHOOKS[{name!r}]"
    if not NAME.fullmatch(name):
        raise SettingsError(f"{where}: a name is 1 to 64 letters, digits, '_', '.' or '-'")
    try:
        config = msgspec.json.decode(raw, type=WebhookConfig)
    except msgspec.DecodeError as exc:
        raise SettingsError(f"{where} is not valid: {exc}") from None
    if not config.tool.strip():
        raise SettingsError(f"{where}: tool must name a tool")
    if config.event_id is not None and not config.event_id.strip():
        raise SettingsError(f"{where}: event_id must be a JSON pointer (/...) or a header's name")
    if config.arguments is not None and config.arguments and not config.arguments.startswith("/"):
        raise SettingsError(f"{where}: arguments must be a JSON pointer, starting with '/'")
    if config.verify == "none":
        return Webhook(name, config)
    return Webhook(name, config, read_secret(where, config.verify, env))


def read_secret(where: str, scheme: Scheme, env: Mapping[str, str]) -> Secret:
    """The scheme's secret, from its variable or its file (exactly one of them)."""
    if (scheme.secret_env is None) == (scheme.secret_file is None):
        raise SettingsError(f"{where}: verify needs exactly one of secret_env and secret_file")
    if scheme.secret_env is not None:
        value = env.get(scheme.secret_env, "").strip()
        source = f"the environment variable {scheme.secret_env}"
    else:
        path = Path(scheme.secret_file or "")
        try:
            value = path.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"{where}: the secret file {path} cannot be read: {type(exc).__name__}") from None
        source = f"the file {path}"
    if not value:
        raise SettingsError(f"{where}: no secret in {source}")
    if isinstance(scheme, StandardWebhooks):
        return Secret(standard_key(where, value, source))
    return Secret(value.encode())


def standard_key(where: str, value: str, source: str) -> bytes:
    """A Standard Webhooks secret's key: the base64 after ``whsec_``."""
    try:
        return signatures.key_of(value)
    except ValueError:
        raise SettingsError(f"{where}: the secret in {source} is not a Standard Webhooks secret "
                            "(whsec_<base64>)") from None
