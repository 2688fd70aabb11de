"""What an operation is called and what it does, as a tool: its name (from ``operationId``,
sanitized to the protocol's rules and made unique), its description, and its effect,
idempotency and confirmation (from its method, unless ``x-carmy-effect`` or an option says
otherwise)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from carmy_worker.sdk.toolbox import EFFECTS, RESERVED_PREFIX
from carmy_worker.wire import Confirmation, Effect

MAX_NAME = 128
MAX_DESCRIPTION = 4096
EFFECT_EXTENSION = "x-carmy-effect"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")

# As the reference implementation maps them (docs/protocol.md): a read is safe to repeat, and so
# is a PUT, which sets a state; a POST or PATCH may not be; a DELETE needs a person's yes.
_BY_METHOD: dict[str, tuple[Effect, bool]] = {
    "GET": ("read", True), "HEAD": ("read", True), "OPTIONS": ("read", True),
    "PUT": ("external_write", True), "POST": ("external_write", False), "PATCH": ("external_write", False),
    "DELETE": ("destructive", False),
}


class Behaviour(NamedTuple):
    effect: Effect
    idempotent: bool
    confirmation: Confirmation


def label(method: str, path: str, operation_id: str | None) -> str:
    """How a person finds the operation in the document: ``GET /pets/{petId} (showPetById)``."""
    return f"{method} {path}" + (f" ({operation_id})" if operation_id else "")


def base_name(method: str, path: str, operation_id: str | None, prefix: str) -> str:
    """The tool's name before it is made unique: the prefix and the sanitized ``operationId``
    (or method and path), never starting with the reserved ``carmy_``."""
    raw = operation_id or f"{method.lower()} {path}"
    name = prefix + (_UNSAFE.sub("_", raw).strip("_") or method.lower())
    if name.startswith(RESERVED_PREFIX):
        name = "op_" + name
    return name[:MAX_NAME]


def unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name_2``, ``name_3``… (cut to fit), whichever is not ``taken`` yet."""
    candidate, n = name, 2
    while candidate in taken:
        suffix = f"_{n}"
        candidate, n = name[:MAX_NAME - len(suffix)] + suffix, n + 1
    taken.add(candidate)
    return candidate


def description(method: str, path: str, operation: Mapping[str, Any]) -> str:
    """The summary, then the description (at most ``MAX_DESCRIPTION`` characters); the method and
    path when the document has neither: agents choose tools by it."""
    parts = [str(operation[k]).strip() for k in ("summary", "description") if isinstance(operation.get(k), str)]
    text = "\n\n".join(dict.fromkeys(p for p in parts if p)) or f"{method} {path}"
    return text if len(text) <= MAX_DESCRIPTION else text[:MAX_DESCRIPTION - 1] + "…"


def behaviour(method: str, declared: object, override: Effect | None) -> Behaviour:
    """The tool's effect, from the option's ``override``, else the operation's ``x-carmy-effect``
    (``declared``), else its method. A declared ``none`` or ``read`` is idempotent whatever the
    method (a search by POST), a declared write only for a PUT; ``destructive`` needs
    confirmation. Raises
    ``ValueError`` for an effect that is not one."""
    effect, idempotent = _BY_METHOD.get(method, ("external_write", False))
    chosen = override if override is not None else declared
    if chosen is not None:
        if chosen not in EFFECTS:
            raise ValueError(f"{EFFECT_EXTENSION} {chosen!r} is not one of {', '.join(EFFECTS)}")
        effect = chosen  # type: ignore[assignment]  # checked against EFFECTS just above
        # A declared read repeats safely; a declared write only where HTTP promises it (PUT).
        idempotent = effect in ("none", "read") or (method == "PUT" and effect != "destructive")
    return Behaviour(effect, idempotent, "required" if effect == "destructive" else "none")
