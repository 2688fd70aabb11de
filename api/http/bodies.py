"""Request bodies decoded into their wire type, or the reason they cannot be (which may quote the
caller: an unknown field's name, cut to ``ECHO_LIMIT``)."""

from __future__ import annotations

from typing import TypeVar

import msgspec

from carmy_worker.sdk.errors import clip

T = TypeVar("T")


def decode(decoder: msgspec.json.Decoder[T], body: bytes) -> T | str:
    """``body`` as ``decoder``'s type, or why it is malformed."""
    try:
        return decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return clip(str(exc))
    except RecursionError:
        return "JSON is nested too deeply"
