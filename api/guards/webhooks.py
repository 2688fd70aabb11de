"""Whether a webhook delivery comes from its sender: checked over the raw body, before it is
parsed, recorded or run (docs/protocol.md, "Webhooks in").

Every comparison goes through ``hmac.compare_digest``; a shared secret in a header is compared
by its SHA-256, so that the time taken does not tell its length either. Standard Webhooks is
implemented here rather than with the ``standardwebhooks`` package (which the tests use to sign,
as a sender would): the package's tolerance is fixed at five minutes, and a malformed header
makes it raise errors other than its own.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping

from api.settings.webhooks import HeaderSecret, HmacSha256, Secret, Webhook
from carmy_worker import signatures

HEX_PREFIX = b"sha256="
# Unix seconds for 30 million years: a longer webhook-timestamp is no time (past a float's range,
# or int()'s limit on digits, it would fail the tolerance's arithmetic), as one with a letter is not.
MAX_TIMESTAMP_DIGITS = 15


UNSIGNED = "The delivery's signature does not verify with this webhook's secret."


def refusal(webhook: Webhook, headers: Mapping[bytes, bytes], body: bytes, now: float | None = None) -> str | None:
    """Why ``body``, with these (lower-case) header fields, is not taken as signed by
    ``webhook``'s secret (the message its sender is answered with), or None if it is. A
    Standard Webhooks delivery signed right but at a time past the tolerance is told so: a
    sender whose clock is off, or a replay, is not the same mistake as a wrong secret."""
    scheme, secret = webhook.config.verify, webhook.secret
    if scheme == "none":
        return None
    if secret is None:  # pragma: no cover - settings read every scheme's secret at start
        return UNSIGNED
    if isinstance(scheme, HmacSha256):
        return None if hmac_sha256(secret, headers.get(scheme.header.lower().encode()), body) else UNSIGNED
    if isinstance(scheme, HeaderSecret):
        return None if header_secret(secret, headers.get(scheme.header.lower().encode())) else UNSIGNED
    at = time.time() if now is None else now
    if not standard(secret, headers, body):
        return UNSIGNED
    off = at - int(headers[b"webhook-timestamp"])
    if abs(off) > scheme.tolerance_s:
        return (f"The delivery's webhook-timestamp is {abs(off):.0f} s {'behind' if off > 0 else 'ahead of'} this "
                f"server's clock, past the webhook's tolerance of {scheme.tolerance_s} s: a replay, or a sender "
                "whose clock is off.")
    return None


def hmac_sha256(secret: Secret, presented: bytes | None, body: bytes) -> bool:
    """The hex digest, with or without GitHub's ``sha256=``."""
    if presented is None:
        return False
    presented = presented.strip().lower().removeprefix(HEX_PREFIX)
    expected = hmac.new(secret.value, body, hashlib.sha256).hexdigest().encode()
    return hmac.compare_digest(expected, presented)


def header_secret(secret: Secret, presented: bytes | None) -> bool:
    if presented is None:
        return False
    return hmac.compare_digest(hashlib.sha256(presented.strip()).digest(), hashlib.sha256(secret.value).digest())


def standard(secret: Secret, headers: Mapping[bytes, bytes], body: bytes) -> bool:
    """Standard Webhooks: ``v1`` HMAC-SHA256 of ``{id}.{timestamp}.{body}``, base64, any of the
    space-separated signatures, over a timestamp of unix seconds (``refusal`` checks that it is
    within the tolerance of ``now``: a signature made with the secret comes first, so that the
    answer tells only the secret's holder about the clock)."""
    msg_id = headers.get(b"webhook-id")
    timestamp = headers.get(b"webhook-timestamp")
    signed = headers.get(b"webhook-signature")
    if not msg_id or not signed or not timestamp or not timestamp.isdigit() or len(timestamp) > MAX_TIMESTAMP_DIGITS:
        return False
    expected = signatures.digest(secret.value, msg_id, timestamp, body)
    found = False
    for entry in signed.split():
        version, _, signature = entry.partition(b",")
        if version != b"v1":
            continue
        try:
            presented = base64.b64decode(signature, validate=True)
        except (binascii.Error, ValueError):
            continue
        found |= hmac.compare_digest(expected, presented)
    return found
