"""An OpenAPI document: read (a file or an http(s) URL, JSON or YAML), validated, and its
references resolved.

Validation is ``openapi-spec-validator``'s (the OpenAPI 3.0 and 3.1 schemas, duplicate
``operationId``s, undeclared path parameters); its first error is reported with the operation it
is in. References (``$ref``, to this document or to other files next to it) are resolved by
``jsonref``, lazily: each stays a proxy that knows where it points, so the schema builder can keep
a referenced schema once, under ``$defs``, and a recursive one stays finite.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx
import jsonref
import yaml

from carmy_worker.sdk.errors import clip

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
FETCH_TIMEOUT = 30.0
_SAFE: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, ten times faster, when built


class _Loader(_SAFE):  # type: ignore[misc]
    """YAML read as its JSON values: an unquoted ``2024-01-31`` stays a string, as OpenAPI means
    it (YAML 1.1's timestamps are no JSON type, and no schema's ``string`` would take them)."""

    yaml_implicit_resolvers: ClassVar[dict[Any, list[tuple[str, Any]]]] = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in _SAFE.yaml_implicit_resolvers.items()
    }


class OpenAPIError(ValueError):
    """A document that cannot be served: unreadable, not OpenAPI 3.0 or 3.1, or invalid. The
    message names the operation at fault, when there is one."""


def _is_url(source: str) -> bool:
    return urlsplit(source).scheme in ("http", "https")


def read(source: str) -> Any:
    """The document at ``source`` (a path, a ``file:`` or an http(s) URL), parsed: JSON, else YAML."""
    try:
        if _is_url(source):
            response = httpx.get(source, timeout=FETCH_TIMEOUT, follow_redirects=True)
            response.raise_for_status()
            text = response.text
        else:
            text = Path(source.removeprefix("file://")).read_text(encoding="utf-8")
    except (OSError, httpx.HTTPError) as exc:
        raise OpenAPIError(f"{source}: cannot be read ({exc})") from exc
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return yaml.load(text, Loader=_Loader)  # a safe loader: libyaml's or the Python one
    except yaml.YAMLError as exc:
        raise OpenAPIError(f"{source}: neither JSON nor YAML ({clip(str(exc))})") from exc


def base_uri(source: str) -> str:
    """The URI that relative references in the document at ``source`` are resolved against."""
    return source if _is_url(source) else Path(source.removeprefix("file://")).resolve().as_uri()


def load(source: str | Path) -> Mapping[str, Any]:
    """The OpenAPI 3.0 or 3.1 document at ``source``, validated, its references resolved (lazily)."""
    where = str(source)
    document = read(where)
    if not isinstance(document, dict):
        raise OpenAPIError(f"{where}: not an OpenAPI document (its root is not an object)")
    version = str(document.get("openapi", ""))
    if "swagger" in document:
        raise OpenAPIError(f"{where}: Swagger {document['swagger']} is not supported: convert it to OpenAPI 3 "
                           "first (e.g. with swagger2openapi)")
    if not version.startswith(("3.0.", "3.1.")):
        raise OpenAPIError(f"{where}: OpenAPI {version or '(no openapi field)'} is not supported: 3.0 or 3.1")
    uri = base_uri(where)
    # Imported here: the validator brings pydantic and jsonschema, which only an import needs.
    from openapi_spec_validator import validate
    from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

    try:
        validate(document, base_uri=uri)
    except OpenAPIValidationError as exc:
        said = clip(exc.message.split("\n", 1)[0], 500)
        raise OpenAPIError(f"{where}: {_located(document, list(exc.absolute_path))}: {said}") from exc
    except Exception as exc:  # the validator's own failures: a reference it cannot retrieve, say
        raise OpenAPIError(f"{where}: cannot be validated ({type(exc).__name__}: {clip(str(exc))})") from exc
    resolved: Mapping[str, Any] = jsonref.replace_refs(document, base_uri=uri, loader=_load_referenced,
                                                       lazy_load=True)
    return resolved


def _load_referenced(uri: str) -> Any:
    return read(uri)


def _located(document: Mapping[str, Any], path: list[Any]) -> str:
    """Where an error is, for a person: the operation (method, path, operationId) when it is in one."""
    if len(path) >= 3 and path[0] == "paths" and str(path[2]).lower() in METHODS:
        method, route = str(path[2]).lower(), str(path[1])
        operation = document.get("paths", {}).get(route, {}).get(method, {})
        op_id = operation.get("operationId") if isinstance(operation, dict) else None
        named = f" ({op_id})" if isinstance(op_id, str) else ""
        inside = _place(operation, path[3:])
        return f"operation {method.upper()} {route}{named}" + (f", at {inside}" if inside else "")
    return "at " + (_place(document, path) or "the document's root")


def _place(node: Any, path: list[Any]) -> str:
    """``["parameters", 0, "schema"]`` in ``node`` as ``parameters[0].schema``."""
    text = ""
    for part in path:
        in_list = isinstance(node, list)
        text += f"[{part}]" if in_list else (f".{part}" if text else str(part))
        try:
            node = node[part] if in_list or part in node else node[str(part)]
        except (KeyError, IndexError, TypeError):
            node = None
    return text
