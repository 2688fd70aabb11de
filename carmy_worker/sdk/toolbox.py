"""The tool SDK: ``Toolbox``, its ``@tools.tool(...)`` decorator and ``tools.schedule(...)``.

Everything about a tool or a schedule is checked when its module is imported, so a bad
definition fails the worker at start with a message naming it, never a caller (or a 3 a.m.
occurrence) at run time.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, get_args

import msgspec

from carmy_worker.jobs.cron import Cron, CronError
from carmy_worker.sdk.context import Context
from carmy_worker.sdk.schema import NO_INPUT_SCHEMA, schema_for
from carmy_worker.wire import Confirmation, Effect, RetryPolicy, ScheduleSpec, ToolSpec, canonical_json_encoder

_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
EFFECTS: tuple[str, ...] = get_args(Effect)
CONFIRMATIONS: tuple[str, ...] = get_args(Confirmation)
_REQUIRED: Any = object()
# The API serves tools of its own under this prefix (carmy_job...): a worker's tool there would
# shadow one, or be shadowed.
RESERVED_PREFIX = "carmy_"


class ToolDefinitionError(TypeError):
    """A tool or schedule definition is invalid; raised at import time and names it."""


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
    retry: RetryPolicy  # for the tool's jobs

    @property
    def name(self) -> str:
        return self.spec.name


class Toolbox:
    """A set of tools and the schedules that run them; ``python -m carmy_worker MODULE`` serves
    every ``Toolbox`` in MODULE."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._schedules: dict[str, ScheduleSpec] = {}

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def schedules(self) -> list[ScheduleSpec]:
        """The schedules declared with ``schedule``, in the order they were."""
        return list(self._schedules.values())

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
        retry: RetryPolicy | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register the decorated function as a tool.

        ``effect`` is required: one of ``none``, ``read``, ``write``, ``external_write``,
        ``destructive``. ``timeout`` is in seconds (default: the worker's
        ``CARMY_DEFAULT_TIMEOUT``). ``title`` is an optional display name for people, served
        as the MCP tool's ``title`` (carmy/1's catalog has no such field). ``retry`` says how a
        job of the tool is tried again after a failure that may pass (default ``RetryPolicy()``:
        five attempts in all, the first retry a second later). The name must not begin with
        ``carmy_``, which is reserved for the API's own tools. The function takes
        ``(ctx: Context)`` or ``(ctx: Context, input: T)`` and returns a msgspec-encodable value;
        input and output annotations are required, as the schemas come from them.
        """

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            tool = _build(
                fn, name=name, title=title, description=description, effect=effect, idempotent=idempotent,
                parallel_safe=parallel_safe, confirmation=confirmation, timeout=timeout, retry=retry,
            )
            if tool.name in self._tools:
                raise ToolDefinitionError(f"tool {tool.name!r}: registered twice in the same Toolbox")
            self._tools[tool.name] = tool
            return fn

        return register

    def schedule(
        self,
        name: str,
        *,
        cron: str,
        tool: str,
        arguments: dict[str, Any] | None = None,
        timezone: str = "UTC",
        grace: float = 60.0,
    ) -> None:
        """Run ``tool`` with ``arguments`` at each occurrence of ``cron`` in ``timezone``.

        ``cron`` has five fields (minute hour day month weekday), or six with a seconds field
        first, or is one of ``@hourly``, ``@daily``, ``@weekly``, ``@monthly``, ``@yearly``.
        ``timezone`` is an IANA name such as ``Europe/Lisbon``: occurrences follow its wall
        clock through DST changes (``carmy_worker.jobs.cron.Cron`` tells what a skipped or
        repeated hour does). Each occurrence queues one job of ``tool``, retried as its
        ``retry`` says; every worker serving this Toolbox declares the schedule, and each
        occurrence is fired once among them. An occurrence missed by more than ``grace``
        seconds (every worker was down) is skipped, not run late.

        Call it after the tool's ``@tools.tool``. Everything is checked now, the arguments
        against the tool's input type too, so a bad schedule fails the worker at start.
        """
        spec = _schedule(self._tools, name=name, cron=cron, tool=tool, arguments=arguments,
                         timezone=timezone, grace=grace)
        if name in self._schedules:
            raise ToolDefinitionError(f"schedule {name!r}: declared twice in the same Toolbox")
        self._schedules[name] = spec


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
    retry: RetryPolicy | None,
) -> Tool:
    tool_name = name if name is not None else getattr(fn, "__name__", "")

    def fail(problem: str) -> ToolDefinitionError:
        return ToolDefinitionError(f"tool {tool_name!r}: {problem}")

    if not isinstance(tool_name, str) or not _NAME.fullmatch(tool_name):
        raise fail("the name must be 1-128 characters of A-Z a-z 0-9 _ - .")
    if tool_name.startswith(RESERVED_PREFIX):
        raise fail(f"the {RESERVED_PREFIX} prefix is reserved for system tools")
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
    if timeout is not None and (not _is_number(timeout) or not 0 < timeout <= 86400):
        raise fail("timeout must be a number of seconds in (0, 86400]")
    policy = _retry_policy(retry, fail)
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
        input_decoder=input_decoder, output_decoder=output_decoder, retry=policy,
    )


def _schedule(tools: dict[str, Tool], *, name: str, cron: str, tool: str, arguments: dict[str, Any] | None,
              timezone: str, grace: float) -> ScheduleSpec:
    def fail(problem: str) -> ToolDefinitionError:
        return ToolDefinitionError(f"schedule {name!r}: {problem}")

    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise fail("the name must be 1-128 characters of A-Z a-z 0-9 _ - .")
    try:
        Cron.parse(cron, timezone)
    except CronError as exc:
        raise fail(str(exc)) from exc
    target = tools.get(tool) if isinstance(tool, str) else None
    if target is None:
        raise fail(f"this Toolbox has no tool {tool!r}: schedule it after its @tool")
    if not _is_number(grace) or not 0 < grace <= 86400:
        raise fail("grace must be a number of seconds in (0, 86400]")
    if arguments is not None and not isinstance(arguments, dict):
        raise fail(f"arguments must be a dict or None, not {type(arguments).__name__}")
    try:
        encoded = canonical_json_encoder.encode(arguments or {})
    except (TypeError, ValueError) as exc:
        raise fail(f"its arguments are not JSON: {exc}") from exc
    _check_arguments(target, encoded, fail)
    return ScheduleSpec(name=name, cron=cron, tool=tool, arguments=encoded, timezone=timezone, grace=float(grace))


def _check_arguments(tool: Tool, encoded: bytes, fail: Callable[[str], Exception]) -> None:
    """The arguments are an input ``tool`` takes: they decode into its input type, and name no
    field its schema does not have (which the API refuses in a call, and msgspec ignores)."""
    if tool.input_decoder is None:
        if encoded != b"{}":
            raise fail(f"tool {tool.name!r} takes no input: its arguments must be {{}} or None")
        return
    try:
        tool.input_decoder.decode(encoded)
    except msgspec.ValidationError as exc:
        raise fail(f"its arguments are not an input of tool {tool.name!r}: {exc}") from exc
    schema = tool.spec.input_schema
    if schema.get("additionalProperties") is False:
        unknown = sorted(set(msgspec.json.decode(encoded)) - set(schema.get("properties", {})))
        if unknown:
            raise fail(f"its arguments are not an input of tool {tool.name!r}: no field {unknown[0]!r}")


def _is_number(value: object) -> bool:
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
    if not _is_number(backoff) or not 0 < backoff <= 86400:
        raise fail("retry.backoff must be a number of seconds in (0, 86400]")
    if not _is_number(ceiling) or not backoff <= ceiling <= 604800:
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
