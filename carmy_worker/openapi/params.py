"""Parameters as the upstream reads them: serialized by their OpenAPI ``style`` and ``explode``,
and the request's URL built from the configured base URL and the operation's path template only.

A path parameter's value is percent-encoded whole (``/``, ``?``, ``#``, ``@`` and ``%``
included), and the values ``.`` and ``..``, which a URL's normalization would turn into a move
up the path, are refused: a parameter never changes the host, nor leaves its own segment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, unquote

import httpx

Location = Literal["path", "query", "header"]
# Styles each location supports here (OpenAPI's defaults first); others make the operation skipped.
STYLES: dict[str, tuple[str, ...]] = {
    "path": ("simple",), "query": ("form", "spaceDelimited", "pipeDelimited", "deepObject"), "header": ("simple",),
}
_JOINERS = {"form": ",", "simple": ",", "spaceDelimited": " ", "pipeDelimited": "|"}


class ParameterError(ValueError):
    """A value that cannot be sent as its parameter (a path segment of ``..``, say)."""


@dataclass(frozen=True)
class Parameter:
    """One parameter of an operation, as the tool's input names it and the upstream reads it."""

    name: str
    location: Location
    required: bool
    style: str
    explode: bool
    as_json: bool  # declared with ``content: application/json``: the value is sent as JSON text


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return json.dumps(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _flat(param: Parameter, value: Any) -> str:
    """``value`` as one string (path and header parameters, unexploded query ones)."""
    if param.as_json:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    joiner = _JOINERS.get(param.style, ",")
    if isinstance(value, list):
        return joiner.join(_text(v) for v in value)
    if isinstance(value, Mapping):
        if param.explode and param.location != "query":
            return ",".join(f"{k}={_text(v)}" for k, v in value.items())
        return joiner.join(part for k, v in value.items() for part in (str(k), _text(v)))
    return _text(value)


def query_pairs(param: Parameter, value: Any) -> list[tuple[str, str]]:
    """The ``(name, value)`` pairs of a query parameter."""
    if param.as_json:
        return [(param.name, _flat(param, value))]
    if isinstance(value, Mapping):
        if param.style == "deepObject":
            return [(f"{param.name}[{k}]", _text(v)) for k, v in value.items()]
        if param.explode:
            return [(str(k), _text(v)) for k, v in value.items()]
    if isinstance(value, list) and param.explode and param.style == "form":
        return [(param.name, _text(v)) for v in value]
    return [(param.name, _flat(param, value))]


def header_value(param: Parameter, value: Any) -> str:
    """A header parameter's value: printable ASCII, spaces and tabs (RFC 9110's field value less
    its obsolete bytes). A line break would end the header; another control character, or a
    character outside ASCII (which httpx cannot encode), is refused here as the caller's mistake
    rather than sent for the upstream to refuse or failing the call as the worker's."""
    text = _flat(param, value)
    if any(c in text for c in "\r\n\0"):
        raise ParameterError(f"the header parameter {param.name!r} cannot contain a line break or NUL")
    if not all(" " <= c <= "~" or c == "\t" for c in text):
        raise ParameterError(f"the header parameter {param.name!r} can hold only printable ASCII, spaces and tabs")
    return text


def path_segment(param: Parameter, value: Any) -> str:
    """A path parameter's value, percent-encoded to stay within its segment."""
    text = _flat(param, value)
    if text in ("", ".", ".."):
        raise ParameterError(f"the path parameter {param.name!r} cannot be {text!r}")
    return quote(text, safe="")


def url(base: httpx.URL, template: str, segments: Mapping[str, str]) -> httpx.URL:
    """``base`` followed by ``template`` with its ``{name}`` replaced by encoded ``segments``,
    checked to be on ``base``'s origin and under its path. A template's ``%2e%2e`` is ``..`` to a
    server that decodes before it resolves dot segments (RFC 3986 lets it): refused as ``..`` is."""
    if dot_segments(template):
        raise ParameterError(f"the path {template!r} has a '.' or '..' segment, which leaves the base URL")
    path = template
    for name, segment in segments.items():
        path = path.replace("{" + name + "}", segment)
    prefix = str(base).rstrip("/")
    target = httpx.URL(prefix + "/" + path.lstrip("/"))
    base_path = base.raw_path.rstrip(b"/")
    if (target.scheme, target.host, target.port) != (base.scheme, base.host, base.port) or not (
            target.raw_path == base_path or target.raw_path.startswith(base_path + b"/")):
        raise ParameterError(f"the path {template!r} with these parameters leaves the base URL")
    return target


def dot_segments(template: str) -> bool:
    """Whether the path ``template`` has a segment that is ``.`` or ``..``, percent-encoded or not."""
    return any(unquote(part) in (".", "..") for part in template.split("/"))
