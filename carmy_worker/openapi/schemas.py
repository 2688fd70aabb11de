"""JSON Schemas (Draft 2020-12, what the API validates arguments with) from OpenAPI schemas.

A referenced schema is kept once, under ``$defs``, and referenced as ``#/$defs/<Name>``: a
large document's schemas, shared by many operations and sometimes recursive, stay the size they
are in the document. Each tool's schema carries only the definitions it uses.

OpenAPI 3.1's schemas are JSON Schema 2020-12 already. 3.0's differ in a few keywords, which are
rewritten: ``nullable`` (a ``"null"`` type), boolean ``exclusiveMinimum``/``exclusiveMaximum``
(numbers), ``example`` (dropped). Keywords of OpenAPI's own that no validator reads
(``discriminator``, ``xml``, ``externalDocs``, ``x-`` extensions) are dropped, as are ``$id``
and ``$schema``, which would change how references resolve. Properties marked ``readOnly`` are
left out of an input (a server sets them), ``writeOnly`` ones are not required of an output.

References are followed without recursion (each definition is built once its referrer is), so a
long chain of schemas, each referring to the next, is no deeper to build than one of them. A
reference inside a value (a ``default``, an ``enum``) is copied out where it stands: those copies
are bounded (``Expansion``), or a few lines of references to references, ten times each, would
make a value of 10^9 elements, as YAML's aliases could.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal
from urllib.parse import unquote, urldefrag, urljoin

import jsonref

Direction = Literal["input", "output"]

_DROPPED = frozenset({"discriminator", "xml", "externalDocs", "example", "$id", "$schema", "$comment"})
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMAS = ("items", "additionalProperties", "not", "contains", "if", "then", "else", "propertyNames",
            "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")
MAX_EXPANDED = 1_000_000  # values copied out of references inside values, in one document
MAX_DEPTH = 200  # levels of a value, its references followed (as a document's own, document.MAX_DEPTH)


class Unbounded(ValueError):
    """A value whose references expand past ``MAX_EXPANDED`` values, or nest past ``MAX_DEPTH``
    levels (one that contains itself never ends)."""


class Expansion:
    """What references inside values may still add, shared by every schema of one document."""

    def __init__(self, most: int = MAX_EXPANDED) -> None:
        self.most = self.left = most


def plain(value: Any, expansion: Expansion | None = None) -> Any:
    """``value`` as plain JSON data, references resolved (for values, not schemas: defaults,
    enums); ``Unbounded`` past ``expansion``'s values, or ``MAX_DEPTH`` levels."""
    return _plain(value, expansion or Expansion(), 0, referenced=False)


def _plain(value: Any, expansion: Expansion, depth: int, *, referenced: bool) -> Any:
    if isinstance(value, jsonref.JsonRef):
        value, referenced = value.__subject__, True
    if referenced:
        expansion.left -= 1
        if expansion.left < 0:
            raise Unbounded(f"the references in its values expand to over {expansion.most:,} values")
    mapping, sequence = isinstance(value, Mapping), isinstance(value, Sequence) and not isinstance(value, str | bytes)
    if (mapping or sequence) and depth >= MAX_DEPTH:
        raise Unbounded(f"a value is nested deeper than {MAX_DEPTH} levels, its references followed "
                        "(or contains itself)")
    if mapping:
        return {str(k): _plain(v, expansion, depth + 1, referenced=referenced) for k, v in value.items()}
    if sequence:
        return [_plain(v, expansion, depth + 1, referenced=referenced) for v in value]
    return value


class SchemaBuilder:
    """Builds the schemas of one tool's input or output, collecting the definitions they use."""

    def __init__(self, *, openapi_30: bool, direction: Direction, expansion: Expansion | None = None) -> None:
        self._openapi_30 = openapi_30
        self._direction = direction
        self._expansion = expansion or Expansion()
        self._names: dict[str, str] = {}  # a reference's URI -> its name under $defs
        self._unbuilt: list[tuple[str, jsonref.JsonRef]] = []  # definitions named, to build
        self.defs: dict[str, Any] = {}

    def build(self, node: Any) -> Any:
        """The JSON Schema for the OpenAPI schema ``node`` (a ``$ref`` becomes one to ``$defs``)."""
        if isinstance(node, jsonref.JsonRef):
            return self._reference(node)
        if isinstance(node, bool):
            return node
        if not isinstance(node, Mapping):
            return {}
        schema: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DROPPED or str(key).startswith("x-") or (key == "nullable" and self._openapi_30):
                continue
            if key in _SCHEMA_MAPS and isinstance(value, Mapping):
                schema[key] = {str(k): self.build(v) for k, v in value.items()}
            elif key in _SCHEMA_LISTS and isinstance(value, Sequence) and not isinstance(value, str):
                schema[key] = [self.build(v) for v in value]
            elif key in _SCHEMAS:
                schema[key] = ([self.build(v) for v in value] if isinstance(value, list) else self.build(value))
            else:
                schema[key] = plain(value, self._expansion)
        self._directed(schema)
        return self._openapi_30_keywords(node, schema) if self._openapi_30 else schema

    def root(self, node: Any) -> dict[str, Any]:
        """``build(node)`` as a whole document: its definitions under ``$defs``, never a root ``$ref``."""
        schema = self.build(node)
        schema = schema if isinstance(schema, dict) else ({} if schema else {"not": {}})
        return self.rooted(schema)

    def rooted(self, schema: dict[str, Any]) -> dict[str, Any]:
        """``schema`` with the definitions collected so far; a root ``$ref`` is inlined."""
        self._build_definitions()
        ref = schema.get("$ref", "") if set(schema) == {"$ref"} else ""
        defs = dict(self.defs)
        if ref.startswith("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
            schema = defs[name]
            if not _mentions(defs, ref):  # only a recursive definition must stay
                del defs[name]
        return {**schema, "$defs": defs} if defs else schema

    def _reference(self, node: jsonref.JsonRef) -> dict[str, Any]:
        # A proxy hands every attribute but a few to what it points to: read its own directly.
        uri = urljoin(object.__getattribute__(node, "base_uri"), node.__reference__["$ref"])
        name = self._names.get(uri)
        if name is None:
            name = self._names[uri] = self._new_name(uri)
            self.defs[name] = {}  # taken now, in the order first referred to; built by rooted()
            self._unbuilt.append((name, node))
        siblings = {k: v for k, v in node.__reference__.items() if k != "$ref"}
        ref = {"$ref": f"#/$defs/{name}"}
        if not siblings:
            return ref
        return {**ref, **{k: v for k, v in self.build(siblings).items() if k != "$ref"}}

    def _build_definitions(self) -> None:
        """Build each definition referred to, and those they refer to, in turn: a chain of
        references is followed in a loop, not by recursion, however long it is."""
        while self._unbuilt:
            name, node = self._unbuilt.pop(0)
            self.defs[name] = self.build(node.__subject__)

    def _new_name(self, uri: str) -> str:
        document, fragment = urldefrag(uri)
        last = unquote(fragment.rstrip("/").rsplit("/", 1)[-1]) if fragment else document.rsplit("/", 1)[-1]
        base = _UNSAFE.sub("_", last).strip("_") or "Schema"
        name, n = base, 2
        while name in self.defs:
            name, n = f"{base}_{n}", n + 1
        return name

    def _directed(self, schema: dict[str, Any]) -> None:
        """Leave out of an input what only a server sets; require of an output nothing a server
        never sends."""
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return
        marker = "readOnly" if self._direction == "input" else "writeOnly"
        marked = {name for name, sub in properties.items() if isinstance(sub, dict) and sub.get(marker) is True}
        if not marked:
            return
        if self._direction == "input":
            schema["properties"] = {k: v for k, v in properties.items() if k not in marked}
        if isinstance(schema.get("required"), list):
            schema["required"] = [r for r in schema["required"] if r not in marked]

    def _openapi_30_keywords(self, node: Mapping[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
        for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            if isinstance(schema.get(exclusive), bool) and schema.pop(exclusive) and bound in schema:
                schema[exclusive] = schema.pop(bound)
        if node.get("nullable") is not True:
            return schema
        kind = schema.get("type")
        if isinstance(kind, str):
            schema["type"] = [kind, "null"]
        elif isinstance(kind, list) and "null" not in kind:
            schema["type"] = [*kind, "null"]
        elif kind is None:
            return {"anyOf": [schema, {"type": "null"}]}
        if isinstance(schema.get("enum"), list) and None not in schema["enum"]:
            schema["enum"] = [*schema["enum"], None]
        return schema


def _mentions(node: Any, ref: str) -> bool:
    if isinstance(node, dict):
        return node.get("$ref") == ref or any(_mentions(v, ref) for v in node.values())
    if isinstance(node, list):
        return any(_mentions(v, ref) for v in node)
    return False
