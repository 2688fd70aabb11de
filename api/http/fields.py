"""A request's header fields, read once: the guards, the authentication and the endpoint all ask
for a few of them, and each used to walk the whole list again."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import Scope

_VIEW = "carmy.fields"  # scope key: (the header list it was built from, the view)
# Fields defined as comma-separated lists (RFC 9110 5.3): repeated, they are one list. Any other
# repeated field is read from its first line, as the guards always read it.
LISTS = frozenset({b"accept", b"prefer"})


def fields(scope: Scope) -> Mapping[bytes, bytes]:
    """The request's header fields by (lower-case) name: the first value of each, or every value
    joined by ``", "`` for ``LISTS``. Built once per request, again only if someone replaced
    ``scope["headers"]`` meanwhile."""
    raw = scope["headers"]
    cached = scope.get(_VIEW)
    if cached is not None and cached[0] is raw:
        view: dict[bytes, bytes] = cached[1]
        return view
    view = {}
    for name, value in raw:
        if name not in view:
            view[name] = value
        elif name in LISTS:
            view[name] += b", " + value
    scope[_VIEW] = (raw, view)
    return view


def header(scope: Scope, name: bytes) -> str | None:
    """One field's value as text (see ``fields``), or None."""
    value = fields(scope).get(name)
    return None if value is None else value.decode("latin-1")
