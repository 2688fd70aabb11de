"""An OpenAPI document: read (a file or an http(s) URL, JSON or YAML), validated, and its
references resolved.

Validation is ``openapi-spec-validator``'s (the OpenAPI 3.0 and 3.1 schemas, duplicate
``operationId``s, undeclared path parameters); its first error is reported with the operation it
is in. References (``$ref``, to this document or to other files next to it) are resolved by
``jsonref``, lazily: each stays a proxy that knows where it points, so the schema builder can keep
a referenced schema once, under ``$defs``, and a recursive one stays finite.

A reference is followed only to where the document came from: from a file, to other files; from a
URL, to URLs of its scheme, host and port, without redirects. Every document the references reach
is read once, before validation, and both the validator and ``jsonref`` are served from what was
read: neither fetches anything itself. Otherwise a document someone else publishes could name
``file:///run/secrets/…`` or a cloud's metadata address in a ``default`` and have the worker
publish what it read there in a tool's schema, which every caller of discovery sees.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urldefrag, urljoin, urlsplit
from urllib.request import url2pathname

import httpx
import jsonref
import yaml

from carmy_worker.sdk.errors import clip

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
FETCH_TIMEOUT = 30.0  # seconds for a document's whole answer (httpx's is for each read)
MAX_VALUES = 1_000_000  # in a YAML document, its aliases expanded (Box's 1 MiB document has 32,000)
MAX_DEPTH = 200  # levels of objects and arrays (Box's document has 22)
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024  # of one document, file or URL (Box's is 1 MiB, GitHub's some 10)
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


def read(source: str, *, redirects: bool = True) -> Any:
    """The document at ``source`` (a path, a ``file:`` or an http(s) URL), parsed: JSON, else YAML.
    Without ``redirects``, an answer that redirects is an error."""
    too_large = OpenAPIError(f"{source}: over {MAX_DOCUMENT_BYTES:,} bytes")
    try:
        if _is_url(source):
            deadline = time.monotonic() + FETCH_TIMEOUT
            with httpx.stream("GET", source, timeout=FETCH_TIMEOUT, follow_redirects=redirects) as response:
                response.raise_for_status()  # a redirect not followed too
                data = bytearray()
                for chunk in response.iter_bytes():  # read no further than the limit, nor the deadline
                    data += chunk
                    if len(data) > MAX_DOCUMENT_BYTES:
                        raise too_large
                    if time.monotonic() > deadline:  # a byte now and then kept each read in time
                        raise OpenAPIError(f"{source}: not read within {FETCH_TIMEOUT:g} s")
                text = data.decode(response.encoding or "utf-8")
        else:
            path = _path(source)
            if path.stat().st_size > MAX_DOCUMENT_BYTES:
                raise too_large
            text = path.read_text(encoding="utf-8")
    except (OSError, httpx.HTTPError, UnicodeDecodeError, LookupError) as exc:  # LookupError: a charset unknown
        raise OpenAPIError(f"{source}: cannot be read ({exc})") from exc
    try:
        aliased = False
        try:
            value = json.loads(text)
        except ValueError:
            try:
                value, aliased = yaml.load(text, Loader=_Loader), True  # a safe loader: libyaml's or the Python one
            except yaml.YAMLError as exc:
                raise OpenAPIError(f"{source}: neither JSON nor YAML ({clip(str(exc))})") from exc
    except RecursionError:
        raise OpenAPIError(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
    _check_tree(value, source, most=MAX_VALUES if aliased else None)
    return value


def _check_tree(value: Any, source: str, *, most: int | None) -> None:
    """A document's values as JSON's are: a tree, at most ``MAX_DEPTH`` deep (the validator and
    jsonref walk it by recursion), and of at most ``most`` values (YAML's, its aliases expanded;
    JSON's are bounded by its bytes). An alias shares its node, so a few lines can make a
    structure that contains itself (every walk of it recurses without end) or one of 10^8 values
    (a walk never ends)."""
    count = 0
    inside: set[int] = set()  # the containers on the path to the node at hand
    stack: list[tuple[Any, int]] = [(value, 1)]  # a depth of 0: leaving a container
    while stack:
        node, depth = stack.pop()
        if depth == 0:
            inside.discard(id(node))
            continue
        count += 1
        if most is not None and count > most:
            raise OpenAPIError(f"{source}: over {most:,} values once its YAML aliases are expanded")
        if isinstance(node, dict | list):
            if id(node) in inside:
                raise OpenAPIError(f"{source}: a YAML alias names a node that contains it: the document has no end")
            if depth > MAX_DEPTH:
                raise OpenAPIError(f"{source}: nested deeper than {MAX_DEPTH} levels")
            inside.add(id(node))
            stack.append((node, 0))
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))


def _path(source: str) -> Path:
    """The file a path or a ``file:`` URI names (a URI's ``%20`` is a space)."""
    return Path(url2pathname(urlsplit(source).path)) if source.startswith("file:") else Path(source)


def base_uri(source: str) -> str:
    """The URI that relative references in the document at ``source`` are resolved against."""
    return source if _is_url(source) else _path(source).resolve().as_uri()


def _origin(uri: str) -> tuple[str, str | None, int | None]:
    """Where ``uri`` is: a URL's scheme, host and port; ``file`` alone for a local file."""
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return ("file", parts.hostname if parts.hostname not in (None, "localhost") else None, None)
    if parts.scheme in ("http", "https"):
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:  # not a port
            port = -1
        return (parts.scheme, parts.hostname, port)
    return (parts.scheme, uri, None)  # no other scheme is read: it matches no document's origin


def _in_folder(target: str, uri: str) -> bool:
    """Whether ``target`` is in the folder of the file document at ``uri`` or below it (links
    followed); true of any URL. A document someone else wrote, saved here, cannot publish the
    worker's other files (``/proc/self/environ``, a mounted secret) in a tool's schema, and a
    document split into files (``paths/``, ``components/``) sits in one folder."""
    if not uri.startswith("file:"):
        return True
    return _path(target).resolve().is_relative_to(_path(uri).resolve().parent)


def _references(node: Any, path: list[Any]) -> Iterator[tuple[list[Any], str]]:
    """Every ``$ref`` in ``node`` with where it is, as ``jsonref`` finds them: in any object."""
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield path, node["$ref"]
        for key, value in node.items():
            yield from _references(value, [*path, key])
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _references(value, [*path, i])  # at most MAX_DEPTH deep (_check_tree)


def _reachable(where: str, document: Mapping[str, Any], uri: str) -> dict[str, Any]:
    """``document`` (read from ``where``, at ``uri``) and every document its references reach, by
    their URIs: each read once, and only from ``uri``'s origin (the module says why)."""
    documents: dict[str, Any] = {uri: document}
    pending = [uri]
    while pending:
        at = pending.pop()
        for path, ref in _references(documents[at], []):
            target = urldefrag(urljoin(at, ref)).url
            if target in documents:
                continue
            place = _located(document, path) if at == uri else f"in {at}"
            if _origin(target) != _origin(uri):
                only = "to other files" if uri.startswith("file:") else "to its own scheme, host and port"
                raise OpenAPIError(f"{where}: {place}: the reference {clip(ref)!r} leads to {clip(target)}, outside "
                                   f"the document's origin: references are followed only {only}")
            if not _in_folder(target, uri):
                raise OpenAPIError(f"{where}: {place}: the reference {clip(ref)!r} leads to {clip(target)}, outside "
                                   "the document's folder: a file's references are followed only to the files in "
                                   "its folder and the folders below it")
            try:
                documents[target] = read(target, redirects=False)
            except OpenAPIError as exc:
                raise OpenAPIError(f"{where}: {place}: the reference {clip(ref)!r}: {exc}") from None
            pending.append(target)
    return documents


class _Served(Mapping[str, Any]):
    """The validator's handlers by scheme: the same one for every scheme, since one it lacks a
    handler for it would open with ``urlopen`` (``in`` is true of any: ``[]`` never raises). It
    answers from the documents already read, and refuses any other."""

    def __init__(self, documents: dict[str, Any]) -> None:
        self._documents = documents

    def __getitem__(self, scheme: str) -> Any:
        return self.serve

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def serve(self, uri: str) -> Any:
        """The document read at ``uri`` (its fragment aside); ``OpenAPIError`` for any other."""
        try:
            return self._documents[urldefrag(uri).url]
        except KeyError:
            raise OpenAPIError(f"{uri} is not among the documents read") from None


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
    documents = _reachable(where, document, uri)
    # Imported here: the validator brings pydantic and jsonschema, which only an import needs.
    from jsonschema_path import SchemaPath
    from openapi_spec_validator.shortcuts import get_validator_cls
    from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

    try:
        # openapi_spec_validator.validate, with handlers that fetch nothing (_Served).
        checked = SchemaPath.from_dict(document, base_uri=uri, handlers=_Served(documents))
        get_validator_cls(document)(checked).validate()
    except OpenAPIValidationError as exc:
        path, said = _refined(document, exc)
        said = clip(said.split("\n", 1)[0], 500)
        raise OpenAPIError(f"{where}: {_located(document, path)}: {said}") from exc
    except Exception as exc:  # the validator's own failures: a reference it cannot retrieve, say
        raise OpenAPIError(f"{where}: cannot be validated ({type(exc).__name__}: {clip(str(exc))})") from exc
    resolved: Mapping[str, Any] = jsonref.replace_refs(document, base_uri=uri, loader=_Served(documents).serve,
                                                       lazy_load=True)
    return resolved


_CHOICES = ("oneOf", "anyOf")


def _refined(document: Mapping[str, Any], exc: Any) -> tuple[list[Any], str]:
    """Where the document is wrong and why, as ``exc`` (a schema error) says, or more exactly.

    The OpenAPI 3.0 schema lets most objects be either themselves or a Reference (a ``oneOf``),
    and the validator's Rust backend keeps no alternative's errors: a response without its
    ``description`` was only "not valid under any of the schemas listed in the 'oneOf' keyword".
    An object without ``$ref`` is no Reference, so its problem is what the other alternative finds:
    looked for again here, with the jsonschema package (only once the document has failed), as
    long as one alternative is left, and kept when it names something more precise."""
    path, said = list(exc.absolute_path), str(exc.message)
    root, where = exc.schema, list(exc.schema_path)
    if not (isinstance(root, dict) and where and where[-1] in _CHOICES):
        return path, said
    try:
        choice, instance = root, document
        for part in where:
            choice = choice[part]
        for step in path:
            instance = instance[step] if isinstance(instance, list) or step in instance else instance[str(step)]
    except (KeyError, IndexError, TypeError):
        return path, said
    import jsonschema
    from jsonschema.exceptions import best_match

    schema = {key: root[key] for key in ("$schema", "definitions", "$defs") if key in root} | {where[-1]: choice}
    error = next(iter(jsonschema.validators.validator_for(root)(schema).iter_errors(instance)), None)
    while error is not None and error.validator in _CHOICES and _no_ref(error.instance):
        alternatives: dict[Any, list[Any]] = {}
        for sub in error.context or ():
            alternatives.setdefault(sub.relative_schema_path[0], []).append(sub)
        left = [errors for errors in alternatives.values() if not any(
            e.validator == "required" and "$ref" in e.validator_value and not e.path for e in errors)]
        if len(left) != 1:
            break
        error = best_match(left[0])
    if error is None or error.validator in _CHOICES:
        return path, said
    return path + list(error.absolute_path), str(error.message)


def _no_ref(instance: Any) -> bool:
    return isinstance(instance, dict) and "$ref" not in instance


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
