"""``python -m carmy_worker --openapi SPEC --base-url URL``: the command line's options, and the
upstream's credentials from the environment, as ``Options``.

Credentials are read from fixed variables, never from arguments (which ``ps`` shows):
``CARMY_OPENAPI_BEARER_TOKEN``; or ``CARMY_OPENAPI_API_KEY`` with ``--api-key-header NAME`` or
``--api-key-query NAME``; or ``CARMY_OPENAPI_USERNAME`` and ``CARMY_OPENAPI_PASSWORD`` (basic).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import cast

from carmy_worker.openapi.auth import (
    API_KEY_ENV,
    BEARER_ENV,
    PASSWORD_ENV,
    USERNAME_ENV,
    Auth,
    AuthError,
    api_key_header,
    api_key_query,
    basic,
    bearer,
)
from carmy_worker.openapi.importer import Options
from carmy_worker.sdk.toolbox import EFFECTS, ToolDefinitionError
from carmy_worker.wire import Effect


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("serve an HTTP API from its OpenAPI document")
    group.add_argument("--openapi", metavar="SPEC", help="an OpenAPI 3.0 or 3.1 document: a file or an http(s) URL")
    group.add_argument("--base-url", metavar="URL", help="where the API is: every call goes there")
    group.add_argument("--operations", metavar="IDS", help="only these operations, comma-separated "
                       "(operationIds, or 'METHOD /path')")
    group.add_argument("--prefix", default="", help="put before every tool's name")
    group.add_argument("--timeout", type=float, metavar="S", help="each tool's timeout (default CARMY_DEFAULT_TIMEOUT)")
    group.add_argument("--connect-timeout", type=float, default=10.0, metavar="S", help="to connect upstream (10)")
    group.add_argument("--strict-output", action="store_true", help="check answers against the response schemas")
    group.add_argument("--effect", action="append", default=[], metavar="OP=EFFECT",
                       help=f"an operation's effect, over its method's ({', '.join(EFFECTS)}); repeatable")
    group.add_argument("--api-key-header", metavar="NAME", help=f"send {API_KEY_ENV} in this header")
    group.add_argument("--api-key-query", metavar="NAME", help=f"send {API_KEY_ENV} in this query parameter")


def options(args: argparse.Namespace, environ: Mapping[str, str]) -> Options:
    """The ``Options`` the arguments and the environment's credentials say; raises
    ``ToolDefinitionError`` for a contradiction or a missing part."""
    if not args.base_url:
        raise ToolDefinitionError("openapi: --base-url is required with --openapi: calls go nowhere else")
    effects: dict[str, Effect] = {}
    for pair in args.effect:
        operation, _, effect = pair.rpartition("=")
        if not operation or effect not in EFFECTS:
            raise ToolDefinitionError(f"openapi: --effect {pair!r} is not OPERATION=EFFECT with an effect among "
                                      f"{', '.join(EFFECTS)}")
        effects[operation] = cast("Effect", effect)  # checked against EFFECTS just above
    only = [o.strip() for o in args.operations.split(",") if o.strip()] if args.operations else None
    return Options(operations=only, prefix=args.prefix, auth=_auth(args, environ), timeout=args.timeout,
                   connect_timeout=args.connect_timeout, strict_output=args.strict_output, effects=effects or None)


def _auth(args: argparse.Namespace, environ: Mapping[str, str]) -> Auth | None:
    kinds = [kind for kind, present in (
        ("bearer", bool(environ.get(BEARER_ENV))),
        ("api key", bool(environ.get(API_KEY_ENV)) or bool(args.api_key_header or args.api_key_query)),
        ("basic", bool(environ.get(USERNAME_ENV) or environ.get(PASSWORD_ENV))),
    ) if present]
    if len(kinds) > 1:
        raise ToolDefinitionError(f"openapi: credentials for {' and '.join(kinds)} are set: choose one")
    try:
        if kinds == ["bearer"]:
            return bearer(environ=environ)
        if kinds == ["basic"]:
            return basic(environ=environ)
        if kinds == ["api key"]:
            if bool(args.api_key_header) == bool(args.api_key_query):
                raise ToolDefinitionError(f"openapi: {API_KEY_ENV} needs exactly one of --api-key-header NAME "
                                          "or --api-key-query NAME")
            if args.api_key_header:
                return api_key_header(args.api_key_header, environ=environ)
            return api_key_query(args.api_key_query, environ=environ)
    except AuthError as exc:
        raise ToolDefinitionError(f"openapi: {exc}") from exc
    return None
