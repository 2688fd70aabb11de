"""A tool's definition, checked: ``Tool`` (its spec and what the worker needs to run it), built
either from a function's annotations (``@tools.tool``) or from JSON Schemas given as data
(``tools.schema_tool``), with the same checks of its name, effect, flags, timeout, retry policy
and description. Every problem is a ``ToolDefinitionError`` naming the tool, at import time."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, get_args

import msgspec

from carmy_worker.sdk.context import Context
from carmy_worker.sdk.schema import NO_INPUT_SCHEMA, SchemaError, SchemaOutput, checked_schema, schema_for
from carmy_worker.settings import MAX_TOOL_TIMEOUT
from carmy_worker.wire import Confirmation, Effect, RetryPolicy, ToolSpec

NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
EFFECTS: tuple[str, ...] = get_args(Effect)
CONFIRMATIONS: tuple[str, ...] = get_args(Confirmation)
REQUIRED: Any = object()  # effect's default: none given
# The API serves tools of its own under this prefix (carmy_job...): a worker's tool there would
# shadow one, or be shadowed.
RESERVED_PREFIX = "carmy_"


class ToolDefinitionError(TypeError):
    """A tool or schedule definition is invalid; raised at import time and names it."""


class OutputDecoder(Protocol):
    """Checks a tool's output (JSON bytes): returns its value, raises if the output is not allowed."""

    def decode(self, buf: bytes, /) -> Any: ...


@dataclass(frozen=True, eq=False)
class Tool:
    """One registered tool: its public spec plus what the worker needs to run it."""

    spec: ToolSpec
    fn: Callable[..., Any]
    is_async: bool
    timeout: float | None
    title: str | None  # a display name for people (MCP's title); agents choose by name and description
    input_type: Any  # None when the tool takes no input
    output_type: Any
    input_decoder: msgspec.json.Decoder[Any] | None
    output_decoder: OutputDecoder
    retry: RetryPolicy  # for the tool's jobs

    @property
    def name(self) -> str:
        return self.spec.name


class _Common(NamedTuple):
    name: str
    description: str
    retry: RetryPolicy
    confirmation: Confirmation  # "required" for a destructive tool, whatever was declared: it always needs one


def _common(
    fn: object, *, name: str | None, title: str | None, description: str | None, effect: Any, idempotent: bool,
    parallel_safe: bool, confirmation: Any, timeout: float | None, retry: RetryPolicy | None,
) -> tuple[_Common, Callable[[str], ToolDefinitionError]]:
    """The checks every tool passes, whatever gives its schemas; and how it reports the next."""
    tool_name = name if name is not None else getattr(fn, "__name__", "")

    def fail(problem: str) -> ToolDefinitionError:
        return ToolDefinitionError(f"tool {tool_name!r}: {problem}")

    if not isinstance(tool_name, str) or not NAME.fullmatch(tool_name):
        raise fail("the name must be 1-128 characters of A-Z a-z 0-9 _ - .")
    if tool_name.startswith(RESERVED_PREFIX):
        raise fail(f"the {RESERVED_PREFIX} prefix is reserved for system tools")
    if title is not None and (not isinstance(title, str) or not title.strip() or len(title) > 200):
        raise fail("a title must be a non-blank string of at most 200 characters")
    if effect is REQUIRED:
        raise fail(f"effect is required, one of {', '.join(EFFECTS)}")
    if effect not in EFFECTS:
        raise fail(f"effect {effect!r} is not one of {', '.join(EFFECTS)}")
    if confirmation not in CONFIRMATIONS:
        raise fail(f"confirmation {confirmation!r} is not one of {', '.join(CONFIRMATIONS)}")
    for flag, value in (("idempotent", idempotent), ("parallel_safe", parallel_safe)):
        if not isinstance(value, bool):
            raise fail(f"{flag} must be a bool")
    if timeout is not None and (not is_number(timeout) or not 0 < timeout <= MAX_TOOL_TIMEOUT):
        raise fail(f"timeout must be a number of seconds in (0, {MAX_TOOL_TIMEOUT}]")
    policy = _retry_policy(retry, fail)
    text = description if description is not None else inspect.getdoc(fn)
    if not isinstance(text, str) or not text.strip():
        raise fail("a description is required (a docstring or description=...): agents choose tools by it")
    return _Common(tool_name, text.strip(), policy, "required" if effect == "destructive" else confirmation), fail


def build(
    fn: Callable[..., Any],
    *,
    name: str | None,
    title: str | None,
    description: str | None,
    effect: Any,
    idempotent: bool,
    parallel_safe: bool,
    confirmation: Any,
    timeout: float | None,
    retry: RetryPolicy | None,
) -> Tool:
    common, fail = _common(fn, name=name, title=title, description=description, effect=effect, idempotent=idempotent,
                           parallel_safe=parallel_safe, confirmation=confirmation, timeout=timeout, retry=retry)
    input_type, output_type = _signature(fn, fail)
    try:
        input_schema = NO_INPUT_SCHEMA if input_type is None else schema_for(input_type)
        output_schema = schema_for(output_type)
        input_decoder = None if input_type is None else msgspec.json.Decoder(input_type)
        output_decoder = msgspec.json.Decoder(output_type)
    except (TypeError, ValueError) as exc:
        raise fail(f"unsupported type annotation: {exc}") from exc
    if input_schema.get("type") != "object":
        raise fail("the input type must be an object (a msgspec Struct, TypedDict, dataclass or dict)")

    spec = ToolSpec(
        name=common.name, description=common.description, input_schema=input_schema, output_schema=output_schema,
        effect=effect, idempotent=idempotent, parallel_safe=parallel_safe, confirmation=common.confirmation,
    )
    return Tool(
        spec=spec, fn=fn, is_async=inspect.iscoroutinefunction(fn), timeout=timeout, title=title,
        input_type=input_type, output_type=output_type,
        input_decoder=input_decoder, output_decoder=output_decoder, retry=common.retry,
    )


def build_schema_tool(
    fn: Callable[..., Any], *, name: str, title: str | None, description: str, effect: Any, idempotent: bool,
    parallel_safe: bool, confirmation: Any, timeout: float | None, retry: RetryPolicy | None,
    input_schema: dict[str, Any], output_schema: dict[str, Any], validate_output: bool,
) -> Tool:
    common, fail = _common(fn, name=name, title=title, description=description, effect=effect, idempotent=idempotent,
                           parallel_safe=parallel_safe, confirmation=confirmation, timeout=timeout, retry=retry)
    if not callable(fn):
        raise fail("only functions can be tools")
    try:
        checked_schema(input_schema)
        output_check = checked_schema(output_schema)
    except SchemaError as exc:
        raise fail(str(exc)) from exc
    if input_schema.get("type") != "object":
        raise fail('the input schema must be an object schema ("type": "object" at its root)')
    spec = ToolSpec(
        name=common.name, description=common.description, input_schema=input_schema, output_schema=output_schema,
        effect=effect, idempotent=idempotent, parallel_safe=parallel_safe, confirmation=common.confirmation,
    )
    return Tool(
        spec=spec, fn=fn, is_async=inspect.iscoroutinefunction(fn), timeout=timeout, title=title,
        input_type=dict[str, Any], output_type=Any,
        input_decoder=msgspec.json.Decoder(dict[str, Any]),
        output_decoder=SchemaOutput(output_check if validate_output else None), retry=common.retry,
    )


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _retry_policy(retry: object, fail: Callable[[str], Exception]) -> RetryPolicy:
    if retry is None:
        return RetryPolicy()
    if not isinstance(retry, RetryPolicy):
        raise fail("retry must be a carmy_worker.RetryPolicy")
    # A Struct's constructor checks no types: a RetryPolicy may hold anything.
    attempts, backoff, ceiling = retry.max_attempts, retry.backoff, retry.max_backoff
    if not isinstance(attempts, int) or isinstance(attempts, bool) or not 1 <= attempts <= 100:
        raise fail("retry.max_attempts must be an int in 1..100")
    if not is_number(backoff) or not 0 < backoff <= 86400:
        raise fail("retry.backoff must be a number of seconds in (0, 86400]")
    if not is_number(ceiling) or not backoff <= ceiling <= 604800:
        raise fail("retry.max_backoff must be a number of seconds from retry.backoff to 604800 (a week)")
    return retry


def _signature(fn: Callable[..., Any], fail: Callable[[str], Exception]) -> tuple[Any, Any]:
    if not callable(fn):
        raise fail("only functions can be tools")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise fail(f"its annotations cannot be resolved: {exc}") from exc
    params = list(inspect.signature(fn).parameters.values())
    if not params or len(params) > 2 or any(
        p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params
    ):
        raise fail("the signature must be (ctx: Context) or (ctx: Context, input: T)")
    if hints.get(params[0].name) is not Context:
        raise fail(f"the first parameter {params[0].name!r} must be annotated as carmy_worker.Context")
    input_type = None
    if len(params) == 2:
        if params[1].name not in hints:
            raise fail(f"the parameter {params[1].name!r} needs a type annotation")
        input_type = hints[params[1].name]
    if "return" not in hints:
        raise fail("a return annotation is required (it gives the output schema)")
    output_type = hints["return"]
    return input_type, type(None) if output_type is None else output_type
