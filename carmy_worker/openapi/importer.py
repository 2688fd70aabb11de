"""An OpenAPI document's operations registered as tools of a ``Toolbox``: what
``Toolbox.openapi`` and ``python -m carmy_worker --openapi`` do."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from carmy_worker.openapi.auth import Auth
from carmy_worker.openapi.document import OpenAPIError, load
from carmy_worker.openapi.operations import Selection, operations
from carmy_worker.openapi.upstream import Upstream
from carmy_worker.sdk.toolbox import Tool, ToolDefinitionError
from carmy_worker.wire import Effect

if TYPE_CHECKING:
    from carmy_worker.sdk.toolbox import Toolbox

log = logging.getLogger("carmy.worker")


@dataclass(frozen=True)
class Options:
    """How an OpenAPI document becomes tools.

    ``operations``: the operations to serve, by ``operationId`` or as ``"METHOD /path"`` (all
    when None). ``prefix``: put before every tool's name (``petstore_``). ``auth``: the
    upstream's credentials (``carmy_worker.openapi.bearer(...)`` and friends, read from the
    environment). ``timeout``: each tool's timeout in seconds (default
    ``CARMY_DEFAULT_TIMEOUT``), the whole upstream call included; ``connect_timeout``: how long
    connecting may take. ``strict_output``: check each answer against the operation's response
    schema (``INVALID_OUTPUT`` when it does not match) instead of passing it on. ``effects``:
    an effect per operation (same keys as ``operations``), over its method's and its
    ``x-carmy-effect``.
    """

    operations: Collection[str] | None = None
    prefix: str = ""
    auth: Auth | None = None
    timeout: float | None = None
    connect_timeout: float = 10.0
    strict_output: bool = False
    effects: Mapping[str, Effect] | None = None


def checked_base_url(value: str) -> httpx.URL:
    """The upstream's base URL: http(s), a host, no credentials, query or fragment."""
    try:
        url = httpx.URL(value)
    except (TypeError, httpx.InvalidURL) as exc:
        raise ToolDefinitionError(f"openapi: the base URL {value!r} is not a URL: {exc}") from exc
    if url.scheme not in ("http", "https") or not url.host or url.userinfo or url.query or url.fragment:
        raise ToolDefinitionError(f"openapi: the base URL {value!r} must be http(s)://host[:port][/path], "
                                  "with no credentials, query or fragment")
    return url


def register(toolbox: Toolbox, spec: str | Path, *, base_url: str, options: Options) -> list[Tool]:
    """Register the tools of ``spec``'s operations on ``toolbox``; see ``Toolbox.openapi``."""
    upstream = Upstream(checked_base_url(base_url), auth=options.auth, connect_timeout=options.connect_timeout)
    filled = frozenset() if options.auth is None else frozenset({(options.auth.where, options.auth.name.lower())})
    selection = Selection(only=options.operations, prefix=options.prefix, effects=options.effects, filled=filled)
    try:
        found, skipped = operations(load(spec), selection)
    except (OpenAPIError, ValueError) as exc:
        raise ToolDefinitionError(f"openapi: {exc}") from exc
    tools = [
        toolbox.schema_tool(
            upstream.handler(op), name=op.name, description=op.description, input_schema=op.input_schema,
            output_schema=op.output_schema, effect=op.effect, idempotent=op.idempotent, parallel_safe=True,
            confirmation=op.confirmation, timeout=options.timeout, validate_output=options.strict_output,
        )
        for op in found
    ]
    log.info("openapi: %s: %d operations served as tools, %d skipped", spec, len(tools), len(skipped))
    return tools

