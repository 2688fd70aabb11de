"""Defining tools: what is refused at import time (naming the tool) and what is accepted."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any, TypedDict

import msgspec
import pytest

from carmy_worker import AgentContext, Context, RetryPolicy, Tool, Toolbox, ToolDefinitionError
from carmy_worker.__main__ import load_schedules, load_tools
from carmy_worker.sdk.schema import NO_INPUT_SCHEMA
from carmy_worker.wire import ScheduleSpec


class Query(msgspec.Struct):
    text: str
    limit: int = 10


class Answer(msgspec.Struct):
    hits: list[str]


class QueryDict(TypedDict):
    text: str


@dataclasses.dataclass
class QueryData:
    text: str
    limit: int = 3


class Plain:
    """Not a type msgspec knows how to encode."""


def register(fn: Callable[..., Any], **options: Any) -> Tool:
    """Register ``fn`` in a fresh Toolbox and return its Tool."""
    options.setdefault("effect", "read")
    box = Toolbox()
    box.tool(**options)(fn)
    (tool,) = box
    return tool


def refused(name: str, problem: str) -> Any:
    """``pytest.raises`` for a definition error that names the tool ``name``."""
    return pytest.raises(ToolDefinitionError, match=re.escape(f"tool {name!r}") + ".*" + problem)


def search(ctx: Context, input: Query) -> Answer:
    """Search the catalog."""
    return Answer(hits=[input.text])


# --- refused at import time -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "x" * 129, "has space", "a/b", "naïve"])
def test_bad_name_is_refused(name: str) -> None:
    with refused(name, "1-128 characters"):
        register(search, name=name)


def test_longest_name_is_accepted() -> None:
    assert register(search, name="a" * 128).name == "a" * 128
    assert register(search, name="Shop.search-v2_x").name == "Shop.search-v2_x"


def test_duplicate_name_in_one_toolbox() -> None:
    box = Toolbox()
    box.tool(effect="read")(search)
    with refused("search", "registered twice"):
        box.tool(effect="read")(search)

    def search_again(ctx: Context) -> int:
        """Another tool under the same name."""
        return 1

    with refused("search", "registered twice"):
        box.tool(effect="none", name="search")(search_again)
    assert [t.name for t in box] == ["search"]


def test_same_name_in_two_toolboxes_of_one_module() -> None:
    with pytest.raises(ToolDefinitionError, match=r"tool 'ping': defined in two Toolboxes of 'tests\.carmy_worker"):
        load_tools("tests.carmy_worker.sdk.two_toolboxes")


def test_load_tools_serves_every_toolbox_once() -> None:
    tools = load_tools("tests.carmy_worker.sdk.aliased_toolbox")
    assert sorted(t.name for t in tools) == ["ping", "pong"]


def test_load_tools_without_tools() -> None:
    with pytest.raises(ToolDefinitionError, match="has no Toolbox"):
        load_tools("json")
    with pytest.raises(ToolDefinitionError, match="registers no tools"):
        load_tools("tests.carmy_worker.sdk.empty_toolbox")


def test_load_schedules_gathers_every_toolbox_once() -> None:
    schedules = load_schedules("tests.carmy_worker.sdk.aliased_toolbox")
    assert sorted((s.name, s.tool, s.timezone) for s in schedules) == [
        ("ping.hourly", "ping", "UTC"), ("pong.nightly", "pong", "Europe/Lisbon")]
    assert load_schedules("tests.toolsets.basic") == []


def test_same_schedule_in_two_toolboxes_of_one_module() -> None:
    module = "tests.carmy_worker.sdk.two_schedules"
    problem = "schedule 'tick': declared in two Toolboxes of " + re.escape(repr(module))
    with pytest.raises(ToolDefinitionError, match=problem):
        load_schedules(module)


def test_effect_is_required() -> None:
    box = Toolbox()
    with refused("search", "effect is required"):
        box.tool()(search)


def test_unknown_effect() -> None:
    with refused("search", "effect 'delete' is not one of"):
        register(search, effect="delete")


def test_bad_confirmation() -> None:
    with refused("search", "confirmation 'always' is not one of"):
        register(search, confirmation="always")


@pytest.mark.parametrize("flag", ["idempotent", "parallel_safe"])
@pytest.mark.parametrize("value", [1, "yes", None])
def test_flags_must_be_bool(flag: str, value: object) -> None:
    with refused("search", f"{flag} must be a bool"):
        register(search, **{flag: value})


@pytest.mark.parametrize("timeout", [0, -1, -0.5, True, False, "5", 86401, float("inf"), float("nan")])
def test_bad_timeout(timeout: object) -> None:
    with refused("search", "timeout must be a number of seconds"):
        register(search, timeout=timeout)


@pytest.mark.parametrize("title", ["", "  ", 5, "x" * 201])
def test_bad_title(title: object) -> None:
    with refused("search", "a title must be a non-blank string"):
        register(search, title=title)


def test_title_is_for_mcp_only() -> None:
    tool = register(search, title="Search the catalog")
    assert tool.title == "Search the catalog"
    assert "title" not in msgspec.json.decode(msgspec.json.encode(tool.spec))  # carmy/1's catalog has none


def test_description_is_required() -> None:
    def quiet(ctx: Context) -> int:
        return 1

    with refused("quiet", "a description is required"):
        register(quiet)
    with refused("quiet", "a description is required"):
        register(quiet, description="   \n ")


def test_input_annotation_is_required() -> None:
    def untyped(ctx: Context, input) -> int:  # type: ignore[no-untyped-def]
        """No input type."""
        return 1

    with refused("untyped", "the parameter 'input' needs a type annotation"):
        register(untyped)


@pytest.mark.parametrize("annotation", [None, AgentContext, int])
def test_first_parameter_must_be_context(annotation: Any) -> None:
    def first(ctx, input: Query) -> int:  # type: ignore[no-untyped-def]
        """Wrong first parameter."""
        return 1

    if annotation is not None:
        first.__annotations__["ctx"] = annotation
    with refused("first", "the first parameter 'ctx' must be annotated as carmy_worker.Context"):
        register(first)


def test_return_annotation_is_required() -> None:
    def no_return(ctx: Context, input: Query):  # type: ignore[no-untyped-def]
        """No output type."""
        return 1

    with refused("no_return", "a return annotation is required"):
        register(no_return)


def test_unresolvable_annotation() -> None:
    def dangling(ctx: Context, input: NotDefinedAnywhere) -> int:  # type: ignore[name-defined]  # noqa: F821
        """Refers to a missing type."""
        return 1

    with refused("dangling", "annotations cannot be resolved"):
        register(dangling)


def test_unsupported_input_type() -> None:
    def odd_input(ctx: Context, input: Plain) -> int:
        """Takes a plain class."""
        return 1

    with refused("odd_input", "unsupported type annotation"):
        register(odd_input)


def test_unsupported_output_type() -> None:
    def odd_output(ctx: Context) -> Plain:
        """Returns a plain class."""
        return Plain()

    with refused("odd_output", "unsupported type annotation"):
        register(odd_output)


@pytest.mark.parametrize("annotation", [int, list[Query], str | None, Query | None])
def test_input_must_be_an_object(annotation: Any) -> None:
    def scalar(ctx: Context, input: int) -> int:
        """Takes a non-object."""
        return input

    scalar.__annotations__["input"] = annotation
    with refused("scalar", "the input type must be an object"):
        register(scalar)


def test_three_parameters() -> None:
    def three(ctx: Context, input: Query, extra: Query) -> int:
        """Too many parameters."""
        return 1

    with refused("three", r"the signature must be \(ctx: Context\)"):
        register(three)


def test_no_parameters() -> None:
    def none_at_all() -> int:
        """No context."""
        return 1

    with refused("none_at_all", "the signature must be"):
        register(none_at_all)


def test_star_args_and_keyword_only() -> None:
    def star(ctx: Context, *args: Query) -> int:
        """Variadic."""
        return 1

    def keyword(ctx: Context, *, input: Query) -> int:
        """Keyword-only input."""
        return 1

    def kwargs(ctx: Context, **input: Query) -> int:
        """Keyword variadic."""
        return 1

    for fn in (star, keyword, kwargs):
        with refused(fn.__name__, "the signature must be"):
            register(fn)


@pytest.mark.parametrize("name", ["carmy_job", "carmy_", "carmy_search.v2"])
def test_the_carmy_prefix_is_reserved(name: str) -> None:
    with refused(name, "the carmy_ prefix is reserved for system tools"):
        register(search, name=name)

    def carmy_status(ctx: Context) -> int:
        """Named like a system tool."""
        return 1

    with refused("carmy_status", "the carmy_ prefix is reserved"):
        register(carmy_status)


def test_names_near_the_reserved_prefix_are_accepted() -> None:
    assert [register(search, name=n).name for n in ("carmy", "carmyjob", "my_carmy_job", "carmy-job")] == [
        "carmy", "carmyjob", "my_carmy_job", "carmy-job"]


@pytest.mark.parametrize(("policy", "problem"), [
    ({"max_attempts": 3}, "retry must be a carmy_worker.RetryPolicy"),
    (RetryPolicy(max_attempts=0), r"retry.max_attempts must be an int in 1\.\.100"),
    (RetryPolicy(max_attempts=101), "retry.max_attempts must be an int"),
    (RetryPolicy(max_attempts=True), "retry.max_attempts must be an int"),
    (RetryPolicy(max_attempts=3.0), "retry.max_attempts must be an int"),  # type: ignore[arg-type]
    (RetryPolicy(backoff=0), r"retry.backoff must be a number of seconds in \(0, 86400\]"),
    (RetryPolicy(backoff=-1), "retry.backoff must be"),
    (RetryPolicy(backoff=86401, max_backoff=86401), "retry.backoff must be"),
    (RetryPolicy(backoff=float("nan")), "retry.backoff must be"),
    (RetryPolicy(backoff=True), "retry.backoff must be"),
    (RetryPolicy(backoff="1"), "retry.backoff must be"),  # type: ignore[arg-type]
    (RetryPolicy(backoff=10, max_backoff=9.5), "retry.max_backoff must be a number of seconds from retry.backoff"),
    (RetryPolicy(max_backoff=604801), "retry.max_backoff must be"),
    (RetryPolicy(max_backoff=float("inf")), "retry.max_backoff must be"),
    (RetryPolicy(max_backoff=None), "retry.max_backoff must be"),  # type: ignore[arg-type]
])
def test_bad_retry_policy(policy: object, problem: str) -> None:
    with refused("search", problem):
        register(search, retry=policy)


def test_retry_policy() -> None:
    assert register(search).retry == RetryPolicy()
    for policy in (RetryPolicy(max_attempts=1, backoff=0.001, max_backoff=0.001),
                   RetryPolicy(max_attempts=100, backoff=86400, max_backoff=604800)):
        assert register(search, retry=policy).retry == policy


def test_error_names_the_overridden_name() -> None:
    with refused("shop.find", "effect 'x' is not one of"):
        register(search, name="shop.find", effect="x")


# --- accepted definitions ---------------------------------------------------------------------


def test_async_and_sync_tools() -> None:
    async def find(ctx: Context, input: Query) -> Answer:
        """Find things."""
        return Answer(hits=[])

    async_tool = register(find, effect="read", idempotent=True, parallel_safe=True, timeout=2.5)
    sync_tool = register(search, effect="write", confirmation="required")
    assert async_tool.is_async and not sync_tool.is_async
    assert async_tool.timeout == 2.5 and sync_tool.timeout is None
    assert (async_tool.spec.effect, async_tool.spec.idempotent, async_tool.spec.parallel_safe) == ("read", True, True)
    assert (sync_tool.spec.effect, sync_tool.spec.idempotent, sync_tool.spec.parallel_safe) == ("write", False, False)
    assert async_tool.spec.confirmation == "none" and sync_tool.spec.confirmation == "required"
    assert async_tool.input_type is Query and async_tool.output_type is Answer


def test_decorator_returns_the_function_unchanged() -> None:
    box = Toolbox()
    assert box.tool(effect="read")(search) is search
    assert box.get("search") is not None and box.get("missing") is None
    assert len(box) == 1


def test_every_effect_is_accepted() -> None:
    effects = ["none", "read", "write", "external_write", "destructive"]
    assert [register(search, effect=e).spec.effect for e in effects] == effects


def test_no_input_tool() -> None:
    async def ping(ctx: Context) -> None:
        """Ping."""

    tool = register(ping)
    assert tool.spec.input_schema == {"type": "object", "properties": {}, "additionalProperties": False}
    assert tool.spec.input_schema == NO_INPUT_SCHEMA
    assert tool.spec.output_schema == {"type": "null"}
    assert tool.input_type is None and tool.input_decoder is None


def test_name_and_description_overrides() -> None:
    tool = register(search, name="catalog.search", description="  Look things up.  ")
    assert tool.name == tool.spec.name == "catalog.search"
    assert tool.spec.description == "Look things up."


def test_description_from_multiline_docstring() -> None:
    def documented(ctx: Context) -> int:
        """Summary line.

        More detail, indented in the source.
        """
        return 1

    assert register(documented).spec.description == "Summary line.\n\nMore detail, indented in the source."


def test_timeout_bounds_are_accepted() -> None:
    assert register(search, timeout=86400).timeout == 86400
    assert register(search, timeout=0.001).timeout == 0.001


@pytest.mark.parametrize(("input_type", "decoded", "has_fields"), [
    (QueryDict, {"text": "hi"}, True),
    (QueryData, QueryData(text="hi", limit=3), True),
    (dict[str, Any], {"text": "hi"}, False),
])
def test_typeddict_dataclass_and_dict_inputs(input_type: Any, decoded: Any, has_fields: bool) -> None:
    def take(ctx: Context, input: Any) -> str:
        """Takes an object."""
        return "ok"

    take.__annotations__["input"] = input_type
    tool = register(take)
    assert tool.spec.input_schema["type"] == "object"
    assert tool.input_decoder is not None
    assert tool.input_decoder.decode(b'{"text": "hi"}') == decoded
    if has_fields:
        assert tool.spec.input_schema["additionalProperties"] is False
        assert tool.spec.input_schema["required"] == ["text"]


# --- schedules --------------------------------------------------------------------------------


def searching() -> Toolbox:
    """A Toolbox with ``search`` (a Query input) and ``ping`` (no input)."""
    box = Toolbox()
    box.tool(effect="read")(search)

    async def ping(ctx: Context) -> None:
        """Ping."""

    box.tool(effect="none")(ping)
    return box


def refused_schedule(name: str, problem: str) -> Any:
    """``pytest.raises`` for a definition error that names the schedule ``name``."""
    return pytest.raises(ToolDefinitionError, match=re.escape(f"schedule {name!r}: ") + ".*" + problem)


def test_a_schedule_is_kept_with_canonical_arguments() -> None:
    box = searching()
    box.schedule("nightly", cron="0 3 * * *", tool="search", arguments={"text": "x", "limit": 3},
                 timezone="Europe/Lisbon", grace=120)
    box.schedule("pinger", cron="*/10 * * * * *", tool="ping")
    box.schedule("pinger.daily", cron="@daily", tool="ping", arguments={})
    assert box.schedules == [
        ScheduleSpec(name="nightly", cron="0 3 * * *", tool="search", arguments=b'{"limit":3,"text":"x"}',
                     timezone="Europe/Lisbon", grace=120.0),
        ScheduleSpec(name="pinger", cron="*/10 * * * * *", tool="ping", arguments=b"{}", timezone="UTC", grace=60.0),
        ScheduleSpec(name="pinger.daily", cron="@daily", tool="ping", arguments=b"{}", timezone="UTC", grace=60.0),
    ]


def test_a_schedule_before_its_tool_is_refused() -> None:
    box = Toolbox()
    with refused_schedule("early", "this Toolbox has no tool 'search': schedule it after its @tool"):
        box.schedule("early", cron="* * * * *", tool="search", arguments={"text": "x"})
    box.tool(effect="read")(search)
    box.schedule("early", cron="* * * * *", tool="search", arguments={"text": "x"})
    assert [s.name for s in box.schedules] == ["early"]


def test_a_schedule_of_another_toolboxs_tool_is_refused() -> None:
    searching()
    with refused_schedule("elsewhere", "this Toolbox has no tool 'search'"):
        Toolbox().schedule("elsewhere", cron="* * * * *", tool="search", arguments={"text": "x"})


def test_a_schedule_declared_twice_is_refused() -> None:
    box = searching()
    box.schedule("tick", cron="* * * * *", tool="ping")
    with refused_schedule("tick", "declared twice in the same Toolbox"):
        box.schedule("tick", cron="0 * * * *", tool="ping")
    assert [s.cron for s in box.schedules] == ["* * * * *"]


@pytest.mark.parametrize("name", ["", "x" * 129, "has space", "a/b"])
def test_bad_schedule_name(name: str) -> None:
    with refused_schedule(name, "the name must be 1-128 characters"):
        searching().schedule(name, cron="* * * * *", tool="ping")


@pytest.mark.parametrize(("options", "problem"), [
    ({"cron": "61 * * * *"}, "cron expression '61 \\* \\* \\* \\*': .*out of range"),
    ({"cron": "@reboot"}, "cron expression '@reboot': the @ forms are"),
    ({"cron": "* * * *"}, "has 4 fields"),
    ({"timezone": "Mars/Olympus"}, "timezone 'Mars/Olympus' is not an IANA timezone name"),
    ({"grace": 0}, r"grace must be a number of seconds in \(0, 86400\]"),
    ({"grace": 86401}, "grace must be"),
    ({"grace": True}, "grace must be"),
    ({"grace": "60"}, "grace must be"),
    ({"grace": float("nan")}, "grace must be"),
])
def test_bad_cron_timezone_or_grace(options: dict[str, Any], problem: str) -> None:
    options = {"cron": "* * * * *", "tool": "ping"} | options
    with refused_schedule("tick", problem):
        searching().schedule("tick", **options)


@pytest.mark.parametrize(("arguments", "problem"), [
    (None, "its arguments are not an input of tool 'search': Object missing required field `text`"),
    ({}, "Object missing required field `text`"),
    ({"text": 5}, r"Expected `str`, got `int` - at `\$.text`"),
    ({"text": "x", "limit": "ten"}, r"Expected `int`, got `str` - at `\$.limit`"),
    ({"text": "x", "limt": 3}, "its arguments are not an input of tool 'search': no field 'limt'"),
    (["x"], "arguments must be a dict or None, not list"),
    ({"text": object()}, "its arguments are not JSON"),
])
def test_arguments_must_be_an_input_of_the_tool(arguments: Any, problem: str) -> None:
    with refused_schedule("nightly", problem):
        searching().schedule("nightly", cron="0 3 * * *", tool="search", arguments=arguments)


def test_a_tool_without_input_takes_no_arguments() -> None:
    with refused_schedule("tick", "tool 'ping' takes no input: its arguments must be {} or None"):
        searching().schedule("tick", cron="* * * * *", tool="ping", arguments={"text": "x"})


def test_a_dict_input_takes_any_fields() -> None:
    def take(ctx: Context, input: dict[str, Any]) -> str:
        """Takes any object."""
        return "ok"

    box = Toolbox()
    box.tool(effect="read")(take)
    box.schedule("any", cron="* * * * *", tool="take", arguments={"b": [1], "a": None})
    assert box.schedules[0].arguments == b'{"a":null,"b":[1]}'
