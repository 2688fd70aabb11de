"""JSON pointers (RFC 6901) into a decoded JSON document: ``/a/0/b``, ``~1`` for ``/`` and
``~0`` for ``~`` in a token; the empty pointer is the whole document."""

from __future__ import annotations

from typing import Any

MISSING: Any = object()  # what a pointer to nothing resolves to


def resolve(document: Any, pointer: str) -> Any:
    """The value ``pointer`` names in ``document``, or ``MISSING``."""
    if pointer == "":
        return document
    if not pointer.startswith("/"):
        return MISSING
    value = document
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict):
            value = value.get(token, MISSING)
        elif isinstance(value, list) and token.isdigit() and (token == "0" or not token.startswith("0")):
            index = int(token)
            value = value[index] if index < len(value) else MISSING
        else:
            return MISSING
        if value is MISSING:
            return MISSING
    return value
