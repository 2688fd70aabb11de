"""The tool SDK: ``Toolbox`` and its ``@tools.tool(...)`` decorator.

Everything about a tool is checked when its module is imported, so a bad definition fails
the worker at start with a message naming the tool, never a caller at run time.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, get_args

import msgspec

from carmy_worker.sdk.context import Context
from carmy_worker.sdk.schema import NO_INPUT_SCHEMA, schema_for
from carmy_worker.wire import Confirmation, Effect, ToolSpec

_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
EFFECTS: tuple[str, ...] = get_args(Effect)
CONFIRMATIONS: tuple[str, ...] = get_args(Confirmation)
_REQUIRED: Any = object()


class ToolDefinitionError(TypeError):
    """A tool definition is invalid; raised at import time and names the tool."""


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
    output_decoder: msgspec.json.Decoder[Any]

    @property
    def name(self) -> str:
        return self.spec.name


class Toolbox:
    """A set of tools; ``python -m carmy_worker MODULE`` serves every ``Toolbox`` in MODULE."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def tool(
        self,
        *,
        name: str | None = None,
        title: str | None = None,
        description: str | None = None,
        effect: Effect = _REQUIRED,
        idempotent: bool = False,
        parallel_safe: bool = False,
        confirmation: Confirmation = "none",
        timeout: float | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register the decorated function as a tool.

        ``effect`` is required: one of ``none``, ``read``, ``write``, ``external_write``,
        ``destructive``. ``timeout`` is in seconds (default: the worker's
        ``CARMY_DEFAULT_TIMEOUT``). ``title`` is an optional display name for people, served
        as the MCP tool's ``title`` (carmy/1's catalog has no such field). The function takes ``(ctx: Context)`` or
        ``(ctx: Context, input: T)`` and returns a msgspec-encodable value; input and output
        annotations are required, as the schemas come from them.
        """

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            tool = _build(
                fn, name=name, title=title, description=description, effect=effect, idempotent=idempotent,
                parallel_safe=parallel_safe, confirmation=confirmation, timeout=timeout,
            )
            if tool.name in self._tools:
                raise ToolDefinitionError(f"tool {tool.name!r}: registered twice in the same Toolbox")
            self._tools[tool.name] = tool
            return fn

        return register


def _build(
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
) -> Tool:
    tool_name = name if name is not None else getattr(fn, "__name__", "")

    def fail(problem: str) -> ToolDefinitionError:
        return ToolDefinitionError(f"tool {tool_name!r}: {problem}")

    if not isinstance(tool_name, str) or not _NAME.fullmatch(tool_name):
        raise fail("the name must be 1-128 characters of A-Z a-z 0-9 _ - .")
    if title is not None and (not isinstance(title, str) or not title.strip() or len(title) > 200):
        raise fail("a title must be a non-blank string of at most 200 characters")
    if effect is _REQUIRED:
        raise fail(f"effect is required, one of {', '.join(EFFECTS)}")
    if effect not in EFFECTS:
        raise fail(f"effect {effect!r} is not one of {', '.join(EFFECTS)}")
    if confirmation not in CONFIRMATIONS:
        raise fail(f"confirmation {confirmation!r} is not one of {', '.join(CONFIRMATIONS)}")
    for flag, value in (("idempotent", idempotent), ("parallel_safe", parallel_safe)):
        if not isinstance(value, bool):
            raise fail(f"{flag} must be a bool")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not 0 < timeout <= 86400):
        raise fail("timeout must be a number of seconds in (0, 86400]")
    text = description if description is not None else inspect.getdoc(fn)
    if not text or not text.strip():
        raise fail("a description is required (a docstring or description=...): agents choose tools by it")

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
        name=tool_name, description=text.strip(), input_schema=input_schema, output_schema=output_schema,
        effect=effect, idempotent=idempotent, parallel_safe=parallel_safe, confirmation=confirmation,
    )
    return Tool(
        spec=spec, fn=fn, is_async=inspect.iscoroutinefunction(fn), timeout=timeout, title=title,
        input_type=input_type, output_type=output_type,
        input_decoder=input_decoder, output_decoder=output_decoder,
    )


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
