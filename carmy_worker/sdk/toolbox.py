"""The tool SDK: ``Toolbox``, its ``@tools.tool(...)`` decorator and ``tools.schedule(...)``.

Everything about a tool or a schedule is checked when its module is imported, so a bad
definition fails the worker at start with a message naming it, never a caller (or a 3 a.m.
occurrence) at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from carmy_worker.jobs.cron import Cron, CronError
from carmy_worker.sdk.context import Context
from carmy_worker.sdk.definition import (
    CONFIRMATIONS,
    EFFECTS,
    NAME,
    REQUIRED,
    RESERVED_PREFIX,
    Tool,
    ToolDefinitionError,
    build,
    build_schema_tool,
    is_number,
)
from carmy_worker.wire import Confirmation, Effect, RetryPolicy, ScheduleSpec, canonical_json_encoder

# Defined with the tool's other checks; importable from here, where they always were.
__all__ = ["CONFIRMATIONS", "EFFECTS", "RESERVED_PREFIX", "Tool", "ToolDefinitionError", "Toolbox"]

if TYPE_CHECKING:
    from pathlib import Path

    from carmy_worker.openapi import Auth


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
        effect: Effect = REQUIRED,
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
            tool = build(
                fn, name=name, title=title, description=description, effect=effect, idempotent=idempotent,
                parallel_safe=parallel_safe, confirmation=confirmation, timeout=timeout, retry=retry,
            )
            self._add(tool)
            return fn

        return register

    def schema_tool(
        self,
        fn: Callable[[Context, dict[str, Any]], Any],
        *,
        name: str,
        description: str,
        input_schema: dict[str, Any],
        output_schema: dict[str, Any],
        effect: Effect = REQUIRED,
        idempotent: bool = False,
        parallel_safe: bool = False,
        confirmation: Confirmation = "none",
        timeout: float | None = None,
        title: str | None = None,
        retry: RetryPolicy | None = None,
        validate_output: bool = False,
    ) -> Tool:
        """Register ``fn`` as a tool whose input and output are given as JSON Schemas (Draft
        2020-12) rather than Python types: for tools built from data, such as an OpenAPI
        document's operations. ``fn(ctx, arguments)`` gets the arguments as a dict.

        The API checks the arguments against ``input_schema`` (an object schema, with no root
        ``$ref``) before any worker sees them. The output is checked against ``output_schema``
        only with ``validate_output``; otherwise any JSON value is passed through. Everything
        else is as for ``tool``, and checked the same way, now.
        """
        tool = build_schema_tool(
            fn, name=name, title=title, description=description, effect=effect, idempotent=idempotent,
            parallel_safe=parallel_safe, confirmation=confirmation, timeout=timeout, retry=retry,
            input_schema=input_schema, output_schema=output_schema, validate_output=validate_output,
        )
        self._add(tool)
        return tool

    def openapi(
        self,
        spec: str | Path,
        *,
        base_url: str,
        operations: Collection[str] | None = None,
        prefix: str = "",
        auth: Auth | None = None,
        timeout: float | None = None,
        connect_timeout: float = 10.0,
        strict_output: bool = False,
        effects: Mapping[str, Effect] | None = None,
    ) -> list[Tool]:
        """Register one tool per operation of the OpenAPI 3.0 or 3.1 document ``spec`` (a file,
        or an http(s) URL read now), each calling the API at ``base_url`` and nowhere else.
        Returns the tools registered.

        ``operations``: only these, by ``operationId`` or as ``"METHOD /path"``. ``prefix``: put
        before every tool's name. ``auth``: the upstream's credentials, read from the environment
        (``carmy_worker.openapi.bearer``, ``api_key_header``, ``api_key_query``, ``basic``).
        ``timeout``: each tool's, the upstream call included (default ``CARMY_DEFAULT_TIMEOUT``);
        ``connect_timeout``: to connect upstream. ``strict_output``: check answers against the
        response schemas. ``effects``: an effect per operation (same keys as ``operations``),
        over its method's and its ``x-carmy-effect``.

        The document is validated now; a bad one fails the worker at start with an error naming
        the operation. Operations that cannot be expressed as a tool (a body that is not JSON)
        are skipped, each logged with its reason. See ``carmy_worker.openapi``.
        """
        from carmy_worker.openapi import Options, register

        options = Options(operations=operations, prefix=prefix, auth=auth, timeout=timeout,
                          connect_timeout=connect_timeout, strict_output=strict_output, effects=effects)
        return register(self, spec, base_url=base_url, options=options)

    def _add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ToolDefinitionError(f"tool {tool.name!r}: registered twice in the same Toolbox")
        self._tools[tool.name] = tool

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


def _schedule(tools: dict[str, Tool], *, name: str, cron: str, tool: str, arguments: dict[str, Any] | None,
              timezone: str, grace: float) -> ScheduleSpec:
    def fail(problem: str) -> ToolDefinitionError:
        return ToolDefinitionError(f"schedule {name!r}: {problem}")

    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise fail("the name must be 1-128 characters of A-Z a-z 0-9 _ - .")
    try:
        Cron.parse(cron, timezone)
    except CronError as exc:
        raise fail(str(exc)) from exc
    target = tools.get(tool) if isinstance(tool, str) else None
    if target is None:
        raise fail(f"this Toolbox has no tool {tool!r}: schedule it after its @tool")
    if not is_number(grace) or not 0 < grace <= 86400:
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


