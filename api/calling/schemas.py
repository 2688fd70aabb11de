"""A tool's input schema, compiled twice: as published, for the verdict, and rewritten, to say
where and why arguments it refuses are wrong, in time and memory that grow with the arguments.

The rewrite is needed for ``anyOf`` and ``oneOf``. Asked for the first problem, jsonschema-rs
answers a failed union with the error of every alternative, each of them whole, nested unions
included, each quoting its value: for a recursive union (a tree of ``Node | Leaf``) that is the
error of every node, seconds and a GiB for half a MiB of arguments. The rewritten union picks
the one alternative that could match, by the value's JSON type or, among objects, by a tag (a
required property whose value each alternative fixes, as msgspec's tagged unions and
discriminated unions elsewhere do), and checks the value against that alternative only, so the
problem reported is the one inside it. When no alternative could match, or when several could,
the union itself is the problem, reported where it is with jsonschema-rs's own message
("… is not valid under any of the schemas listed in the 'anyOf' keyword"), built from a single
error. Rewritten or not, a schema accepts the same values: only the verdict of the published one
is used, and the rewritten one is asked only about values that the published one refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonschema_rs

UNIONS = ("anyOf", "oneOf")
# The order the rewritten union tests a value's type in: "integer" before "number", which
# admits integers too; a value classed as "number" is a number with a fraction.
JSON_TYPES = ("integer", "number", "string", "boolean", "null", "array", "object")
ANY_TYPE = frozenset(JSON_TYPES)

# Keywords whose value is a subschema, a list of them, or a map of names to them (every draft's).
ONE_SCHEMA = frozenset({"additionalItems", "additionalProperties", "contains", "contentSchema", "else",
                        "if", "items", "not", "propertyNames", "then", "unevaluatedItems",
                        "unevaluatedProperties"})
SCHEMA_LISTS = frozenset({"allOf", "anyOf", "items", "oneOf", "prefixItems"})
SCHEMA_MAPS = frozenset({"$defs", "definitions", "dependencies", "dependentSchemas", "patternProperties",
                         "properties"})
# Drafts without if/then/else, which the rewrite is made of: it is read as the next one's.
NO_CONDITIONALS = ("draft-04", "draft-06")
DRAFT_7 = "http://json-schema.org/draft-07/schema#"
# How many times larger than the schema its rewrite may be: an alternative admitting several
# types can be copied into several branches, and so can a union inside it (msgspec's are all
# under $defs, copied as a $ref).
GROWTH = 50


@dataclass(frozen=True)
class InputSchema:
    """A tool's input schema, ready to check arguments: ``is_valid`` first, and for arguments it
    refuses, ``locate`` for where and why."""

    validator: jsonschema_rs.Validator
    # The rewritten schema's validator (the schema's own if it has no union); None if the
    # rewrite does not compile (a $ref pointing into an anyOf's items, a Draft 4 idiom that
    # Draft 7 refuses).
    locator: jsonschema_rs.Validator | None

    @classmethod
    def compile(cls, schema: dict[str, Any]) -> InputSchema:
        """Raises ``ValueError`` if ``schema`` is not one; ``format`` is an annotation."""
        validator = jsonschema_rs.validator_for(schema, validate_formats=False)
        if not _has_union(schema):
            return cls(validator, validator)  # its first error is found without a union's cost
        rewritten = _Rewrite(schema).schema(schema)
        if _weight(rewritten, {}) > GROWTH * _weight(schema, {}):
            return cls(validator, None)  # unions nested inline, many deep: not worth a large copy
        if any(draft in str(schema.get("$schema", "")) for draft in NO_CONDITIONALS):
            rewritten["$schema"] = DRAFT_7
        try:
            return cls(validator, jsonschema_rs.validator_for(rewritten, validate_formats=False))
        except (ValueError, jsonschema_rs.ReferencingError):
            return cls(validator, None)

    def is_valid(self, value: object) -> bool:
        return self.validator.is_valid(value)

    def locate(self, value: object) -> jsonschema_rs.ValidationError | None:
        """The first problem of ``value``, in time and memory that grow with it; None if it has
        none, or if the schema has no usable rewrite (then it cannot be told in bounded time)."""
        if self.locator is None:
            return None
        try:
            self.locator.validate(value)
        except jsonschema_rs.ValidationError as problem:
            return problem
        return None


def _has_union(schema: object) -> bool:
    if isinstance(schema, dict):
        return any(isinstance(schema.get(k), list) for k in UNIONS) or any(map(_has_union, schema.values()))
    return isinstance(schema, list) and any(map(_has_union, schema))


class _Rewrite:
    """Rewrites every union of one schema document, walking subschemas only (not ``const``,
    ``enum`` or ``default`` values, which may look like schemas)."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        # A $ref is followed (to learn a type or a tag) only within one resource: no nested $id.
        self.resolvable = not _has_nested_id(root, top=True)

    def schema(self, node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in UNIONS and isinstance(value, list):
                continue
            if key in ONE_SCHEMA or (key in SCHEMA_LISTS and isinstance(value, list)):
                out[key] = [self.schema(v) for v in value] if isinstance(value, list) else self.schema(value)
            elif key in SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {name: self.schema(v) for name, v in value.items()}
            else:
                out[key] = value
        unions = [self.union(k, node[k]) for k in UNIONS if isinstance(node.get(k), list)]
        if unions:
            out["allOf"] = [*out.get("allOf", []), *unions]
        return out

    def union(self, keyword: str, alternatives: list[Any]) -> Any:
        """A union as if/then/else on the value's JSON type: the types grouped by the
        alternatives that admit them, each group's branch as ``pick`` says."""
        rewritten = [self.schema(a) for a in alternatives]
        admits = [self.types(a) for a in alternatives]
        groups: dict[tuple[int, ...], list[str]] = {}  # in JSON_TYPES' order: integers first
        for json_type in JSON_TYPES:
            groups.setdefault(tuple(i for i, a in enumerate(admits) if json_type in a), []).append(json_type)
        *tested, last = [(self.pick(keyword, could, types, alternatives, rewritten), types)
                         for could, types in groups.items()]
        chain: Any = last[0]  # the types left
        for branch, types in reversed(tested):
            chain = {"if": {"type": types}, "then": branch, "else": chain}
        return chain

    def pick(self, keyword: str, could: tuple[int, ...], types: list[str], alternatives: list[Any],
             rewritten: list[Any]) -> Any:
        """For values of these types: the one alternative that could match them; else, for
        objects, the one their tag names; else the union (which checks every alternative, and
        fails with one short error)."""
        none: dict[str, Any] = {keyword: [False]}  # "… is not valid under any of the schemas …"
        if not could:
            return none
        if len(could) == 1:
            return rewritten[could[0]]
        tagged = self.tag(could, alternatives) if types == ["object"] else None
        if tagged is not None:
            name, tags = tagged
            # Reached by a value without a known tag only: its error is the missing or unknown tag.
            chain: dict[str, Any] = {"required": [name], "properties": {name: {"enum": tags}}}
            for tag, i in reversed(list(zip(tags, could, strict=True))):
                chain = {"if": {"required": [name], "properties": {name: {"const": tag}}},
                         "then": rewritten[i], "else": chain}
            return chain
        ambiguous = [rewritten[i] for i in could]
        if keyword == "anyOf":
            return {"if": {"anyOf": ambiguous}, "else": none}
        several = {"oneOf": [True, True]}  # "… is valid under more than one of the schemas …"
        return {"if": {"oneOf": ambiguous}, "else": {"if": {"anyOf": ambiguous}, "then": several, "else": none}}

    def tag(self, could: tuple[int, ...], alternatives: list[Any]) -> tuple[str, list[str | int]] | None:
        """A property every one of these (object) alternatives requires, with one value of its
        own in each, and those values distinct; None if there is none."""
        shapes = [self.resolve(alternatives[i]) for i in could]
        if not all(isinstance(s, dict) and isinstance(s.get("properties"), dict) for s in shapes):
            return None
        for name in shapes[0]["properties"]:
            tags = [_fixed(s["properties"].get(name)) if name in s.get("required", ()) else None for s in shapes]
            if all(t is not None for t in tags) and len(set(tags)) == len(tags):
                return name, [t for t in tags if t is not None]
        return None

    def types(self, node: Any, seen: frozenset[str] = frozenset()) -> frozenset[str]:
        """The JSON types ``node`` may admit (all of them when it cannot be told): a superset,
        so an alternative left out of a type's choice can never match a value of that type."""
        if node is False:
            return frozenset()
        if not isinstance(node, dict):
            return ANY_TYPE
        admits = ANY_TYPE
        if isinstance(node.get("type"), str | list):
            named = {node["type"]} if isinstance(node["type"], str) else set(node["type"])
            admits &= named | ({"integer"} if "number" in named else set())
        if "const" in node:
            admits &= {_type_of(node["const"])}
        if isinstance(node.get("enum"), list):
            admits &= {_type_of(v) for v in node["enum"]}
        for keyword in UNIONS:
            if isinstance(node.get(keyword), list):
                admits &= frozenset().union(*(self.types(a, seen) for a in node[keyword]))
        for part in node.get("allOf", []) if isinstance(node.get("allOf"), list) else []:
            admits &= self.types(part, seen)
        ref = node.get("$ref")
        if isinstance(ref, str) and ref not in seen:
            target = self.resolve({"$ref": ref})
            if target is not None:
                admits &= self.types(target, seen | {ref})
        return frozenset(admits)

    def resolve(self, node: Any) -> Any:
        """A ``{"$ref": "#/…"}`` alternative's target in this document (None if elsewhere), or
        the alternative itself."""
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)):
            return node
        ref: str = node["$ref"]
        if not (self.resolvable and (ref == "#" or ref.startswith("#/"))):
            return None
        target: Any = self.root
        for token in ref[2:].split("/") if ref != "#" else []:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                return None
        return target


def _fixed(prop: Any) -> str | int | None:
    """The one value a property schema allows, if it is a string or an integer (a tag)."""
    if not isinstance(prop, dict):
        return None
    values = [prop["const"]] if "const" in prop else prop.get("enum")
    if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str | int) \
            and not isinstance(values[0], bool):
        return values[0]
    return None


def _type_of(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string" if isinstance(value, str) else "array" if isinstance(value, list) else "object"


def _weight(node: Any, seen: dict[int, int]) -> int:
    """How many values ``node`` holds once written out, a part shared by reference counted
    where it appears each time, but computed once."""
    if id(node) not in seen:
        parts = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        seen[id(node)] = 1 + sum(_weight(v, seen) for v in parts)
    return seen[id(node)]


def _has_nested_id(node: Any, *, top: bool = False) -> bool:
    if isinstance(node, dict):
        return (not top and "$id" in node) or any(_has_nested_id(v) for v in node.values())
    return isinstance(node, list) and any(_has_nested_id(v) for v in node)
