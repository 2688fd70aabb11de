"""An OpenAPI document's operations, each as what a tool needs: its name, description,
behaviour, parameters and JSON Schemas; or the reason it cannot be one (``Skipped``).

The input is an object: each path, query and header parameter by its name, and the JSON request
body under ``body``. Cookie parameters are dropped (an agent's call carries no cookies; an
operation that requires one is skipped), and so are the header parameters HTTP or the worker
sets (``Accept``, ``Content-Type``, ``Authorization``, ``Idempotency-Key``; ``Host``,
``Content-Length``, ``Transfer-Encoding`` and the hop-by-hop ones) and a parameter the
configured credentials fill. The output is the JSON success response's schema (``null`` for one
without a body, a string for a text one).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import jsonref

from carmy_worker.openapi import naming
from carmy_worker.openapi.params import STYLES, Parameter, dot_segments
from carmy_worker.openapi.schemas import Expansion, SchemaBuilder, Unbounded, plain
from carmy_worker.wire import Confirmation, Effect

log = logging.getLogger("carmy.worker")

BODY = "body"
_JSON = re.compile(r"^application/([\w.\-]+\+)?json(\s*;.*)?$", re.IGNORECASE)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP field name (RFC 9110, 5.1)
# Header parameters a caller does not set: those OpenAPI says to ignore and the worker sets, and
# HTTP's own, which would steer the request (Host: another site of the server) or frame it
# (Content-Length, Transfer-Encoding: for whatever stands in front of the upstream).
_SET_BY_WORKER = frozenset({"accept", "content-type", "authorization", "idempotency-key", "host", "content-length",
                            "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade", "expect",
                            "proxy-authorization", "proxy-connection"})


class Unservable(Exception):
    """Why an operation cannot be a tool; it is skipped with this reason."""


@dataclass(frozen=True)
class Operation:
    name: str
    method: str
    path: str
    label: str  # method, path and operationId, for logs
    description: str
    effect: Effect
    idempotent: bool
    confirmation: Confirmation
    parameters: tuple[Parameter, ...]
    has_body: bool
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]


@dataclass(frozen=True)
class Skipped:
    label: str
    reason: str


@dataclass(frozen=True)
class Selection:
    """Which operations become tools and how they are named: ``only`` (operationIds or
    ``METHOD /path``; all when None), a name ``prefix``, ``effects`` (overrides by the same keys),
    and the parameter names the worker's credentials fill (``(location, name)``, lower-case)."""

    only: Collection[str] | None = None
    prefix: str = ""
    effects: Mapping[str, Effect] | None = None
    filled: frozenset[tuple[str, str]] = frozenset()


def operations(document: Mapping[str, Any], selection: Selection) -> tuple[list[Operation], list[Skipped]]:
    """Every operation of ``document`` (resolved) the selection takes, as an ``Operation`` or
    as ``Skipped``. Raises ``ValueError`` naming the operation for a bad ``x-carmy-effect``,
    and for names in ``only`` or ``effects`` that match no operation."""
    openapi_30 = str(document.get("openapi", "")).startswith("3.0.")
    expansion = Expansion()  # for the whole document: each tool's schemas copy the values they refer to
    found: list[Operation] = []
    skipped: list[Skipped] = []
    taken: set[str] = set()
    known: set[str] = set()
    for route, item in (document.get("paths") or {}).items():
        for method in _methods(item):
            operation = item[method]
            op_id = operation.get("operationId") if isinstance(operation.get("operationId"), str) else None
            keys = {k for k in (op_id, f"{method.upper()} {route}") if k}
            known |= keys
            if selection.only is not None and not keys & set(selection.only):
                continue
            label = naming.label(method.upper(), route, op_id)
            try:
                found.append(_operation(method.upper(), str(route), item, operation, label, op_id, selection,
                                        taken, openapi_30, expansion))
            except Unservable as why:
                log.warning("openapi: %s skipped: %s", label, why)
                skipped.append(Skipped(label, str(why)))
            except Unbounded as exc:
                raise ValueError(f"{label}: {exc}") from None
            except (TypeError, KeyError, AttributeError, RecursionError, jsonref.JsonRefError) as exc:
                # A shape the validator let through and this module did not foresee, a reference
                # into another file that does not resolve, or a chain of references to references
                # longer than jsonref can follow (it recurses, some 300 of them): name the operation.
                raise ValueError(f"{label}: cannot be read ({type(exc).__name__}: {exc})") from exc
    unknown = sorted({*(selection.only or ()), *(selection.effects or {})} - known)
    if unknown:
        raise ValueError(f"no operation is named {', '.join(map(repr, unknown))} (an operationId or 'METHOD /path')")
    return found, skipped


def _methods(item: Any) -> list[str]:
    if not isinstance(item, Mapping):
        return []
    return [m for m in ("get", "put", "post", "delete", "options", "head", "patch") if isinstance(item.get(m), Mapping)]


def _operation(method: str, route: str, item: Mapping[str, Any], operation: Mapping[str, Any], label: str,
               op_id: str | None, selection: Selection, taken: set[str], openapi_30: bool,
               expansion: Expansion) -> Operation:
    if dot_segments(route):  # every call would leave the base URL's path, and be refused
        raise Unservable("its path has a '.' or '..' segment (percent-encoded or not), which leaves the base URL")
    override = next((e for k, e in (selection.effects or {}).items() if k in (op_id, f"{method} {route}")), None)
    try:
        behaviour = naming.behaviour(method, operation.get(naming.EFFECT_EXTENSION), override)
    except ValueError as exc:
        raise ValueError(f"{label}: {exc}") from exc
    inputs = SchemaBuilder(openapi_30=openapi_30, direction="input", expansion=expansion)
    parameters, properties, required = _parameters(item, operation, selection, inputs)
    has_body = _body(operation, inputs, properties, required)
    input_schema = inputs.rooted({"type": "object", "properties": properties, "required": required,
                                  "additionalProperties": False})
    if not required:
        del input_schema["required"]
    output_schema = _output(operation, SchemaBuilder(openapi_30=openapi_30, direction="output", expansion=expansion))
    name = naming.unique(naming.base_name(method, route, op_id, selection.prefix), taken)
    return Operation(
        name=name, method=method, path=route, label=label, description=naming.description(method, route, operation),
        effect=behaviour.effect, idempotent=behaviour.idempotent, confirmation=behaviour.confirmation,
        parameters=tuple(parameters), has_body=has_body, input_schema=input_schema, output_schema=output_schema,
    )


def _parameters(item: Mapping[str, Any], operation: Mapping[str, Any], selection: Selection,
                builder: SchemaBuilder) -> tuple[list[Parameter], dict[str, Any], list[str]]:
    # The operation's parameters override the path item's of the same name and location.
    merged = {(p.get("in"), p.get("name")): p for p in [*(item.get("parameters") or ()),
                                                        *(operation.get("parameters") or ())]}
    parameters: list[Parameter] = []
    properties: dict[str, Any] = {}
    required: list[str] = []
    for (location, name), spec in merged.items():
        name, location = str(name), str(location)
        if location == "cookie" or (location == "header" and name.lower() in _SET_BY_WORKER) or (
                (location, name.lower()) in selection.filled):
            if spec.get("required") and location == "cookie":
                raise Unservable(f"it requires the cookie {name!r}, which a tool call cannot carry")
            log.info("openapi: parameter %s %r is not part of the tool's input (%s)", location, name,
                     "a tool call carries no cookies" if location == "cookie" else "HTTP or the worker sets it")
            continue
        if location == "header" and not _TOKEN.fullmatch(name):
            raise Unservable(f"its header parameter {name!r} is not a name an HTTP header can have")
        style = str(spec.get("style") or STYLES[location][0])
        if style not in STYLES[location]:
            raise Unservable(f"the {location} parameter {name!r} has the style {style!r}, which is not supported")
        schema, as_json = _parameter_schema(name, spec)
        if name in properties or name == BODY:
            raise Unservable(f"two inputs would be named {name!r}")
        prop = builder.build(schema)
        if isinstance(spec.get("description"), str) and isinstance(prop, dict) and "description" not in prop:
            prop = {**prop, "description": spec["description"]}
        properties[name] = prop
        if spec.get("required") or location == "path":
            required.append(name)
        explode = bool(spec.get("explode", style == "form"))
        parameters.append(Parameter(name=name, location=location, required=name in required,  # type: ignore[arg-type]
                                    style=style, explode=explode, as_json=as_json))
    return parameters, properties, required


def _parameter_schema(name: str, spec: Mapping[str, Any]) -> tuple[Any, bool]:
    if "schema" in spec:
        return spec["schema"], False
    content = spec.get("content") or {}
    media = next((m for m in content if _JSON.match(str(m))), None)
    if media is None:
        raise Unservable(f"the parameter {name!r} is sent as {', '.join(map(str, content)) or 'nothing'}, not JSON")
    return (content[media] or {}).get("schema", {}), True


def _body(operation: Mapping[str, Any], builder: SchemaBuilder, properties: dict[str, Any],
          required: list[str]) -> bool:
    body = operation.get("requestBody")
    if not isinstance(body, Mapping):
        return False
    content = body.get("content") or {}
    media = next((m for m in content if _JSON.match(str(m))), None)
    if media is None:
        kinds = ", ".join(map(str, content)) or "no media type"
        raise Unservable(f"its request body is {kinds}: only JSON bodies can be a tool's input")
    properties[BODY] = builder.build((content[media] or {}).get("schema", {}))
    if isinstance(body.get("description"), str) and isinstance(properties[BODY], dict):
        properties[BODY] = {**properties[BODY], "description": body["description"]}
    if body.get("required"):
        required.append(BODY)
    return True


def _output(operation: Mapping[str, Any], builder: SchemaBuilder) -> dict[str, Any]:
    responses = operation.get("responses") or {}
    success = [r for code, r in responses.items() if re.fullmatch(r"2(\d\d|XX)", str(code).upper())]
    if not success and "default" in responses:
        success = [responses["default"]]
    if not success:
        return {}
    schemas: list[Any] = []
    for response in success:
        content = (response or {}).get("content") or {}
        media = next((m for m in content if _JSON.match(str(m))), None)
        if media is not None:
            schema: Any = builder.build((content[media] or {}).get("schema", {}))
        elif not content:
            schema = {"type": "null"}
        elif any(str(m).lower().startswith("text/") for m in content):
            schema = {"type": "string"}
        else:
            raise Unservable(f"its response is {', '.join(map(str, content))}: only JSON or text can be a result")
        if plain(schema) not in schemas:
            schemas.append(schema)
    root = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return builder.rooted(root if isinstance(root, dict) else {})
