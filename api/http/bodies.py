"""Request bodies decoded into their wire type, or the reason they cannot be (which may quote the
caller: an unknown field's name, cut to ``ECHO_LIMIT``)."""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec

from carmy_worker.sdk.errors import clip

T = TypeVar("T")

# msgspec's words for an unknown field, at the top level or at a path of ours (``$.notify``).
_UNKNOWN_FIELD = re.compile(r"(Object contains unknown field `)(.*?)(`(?: - at `\$[.\w\[\]]{0,64}`)?)", re.DOTALL)


def decode(decoder: msgspec.json.Decoder[T], body: bytes) -> T | str:
    """``body`` as ``decoder``'s type, or why it is malformed."""
    try:
        return decoder.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return _reason(str(exc))
    except RecursionError:
        return "JSON is nested too deeply"


def _reason(message: str) -> str:
    """msgspec's message, with the name of an unknown field cut rather than the whole message, so
    that the mark gives the name's own length and the message still ends as it does."""
    unknown = _UNKNOWN_FIELD.fullmatch(message)
    if unknown is None:
        return clip(message)
    before, name, after = unknown.groups()
    return before + clip(name) + after
