"""Standard Webhooks signatures (standardwebhooks.com), the one place both sides compute them: the
API checking a delivery in (``api.guards.webhooks``) and the workers signing a callback out
(``carmy_worker.jobs.callbacks``). A secret is ``whsec_`` and the key in base64; a signature is
``v1,`` and the base64 HMAC-SHA256, keyed by that key, of ``{id}.{timestamp}.{body}``."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

PREFIX = "whsec_"


def key_of(secret: str) -> bytes:
    """The key of a ``whsec_<base64>`` secret (the prefix may be left out); ValueError if it is
    not base64 or empty."""
    try:
        key = base64.b64decode(secret.removeprefix(PREFIX), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if not key:
        raise ValueError("not a Standard Webhooks secret (whsec_<base64>)")
    return key


def digest(key: bytes, message_id: bytes, timestamp: bytes, body: bytes) -> bytes:
    """The raw HMAC-SHA256 a ``v1`` signature carries in base64."""
    return hmac.new(key, message_id + b"." + timestamp + b"." + body, hashlib.sha256).digest()


def signature(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,<base64>``."""
    return "v1," + base64.b64encode(digest(key, message_id.encode(), str(timestamp).encode(), body)).decode()
