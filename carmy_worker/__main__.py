"""``python -m carmy_worker MODULE``: serve every Toolbox found in MODULE; with ``--openapi SPEC
--base-url URL``, the operations of an HTTP API's OpenAPI document as well (or alone)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Coroutine
from typing import Any

from carmy_worker import collector, heap, logs
from carmy_worker.openapi import cli, register  # the document validator itself loads only for --openapi
from carmy_worker.runtime.service import serve
from carmy_worker.sdk.toolbox import Tool, Toolbox, ToolDefinitionError
from carmy_worker.settings import SettingsError, WorkerSettings
from carmy_worker.store.connect import RedisConnector
from carmy_worker.wire import ScheduleSpec

log = logging.getLogger("carmy.worker")

# How long a stopped worker waits for threads still running (a timed-out sync tool finishing)
# before it exits without them.
THREADS_GRACE_S = 1.0


def _toolboxes(module_name: str) -> list[Toolbox]:
    """Every ``Toolbox`` in ``module_name``, once each however many names it has there."""
    module = importlib.import_module(module_name)
    boxes = {id(value): value for value in vars(module).values() if isinstance(value, Toolbox)}
    if not boxes:
        raise ToolDefinitionError(f"module {module_name!r} has no Toolbox")
    return list(boxes.values())


def load_tools(module_name: str | None, extra: Toolbox | None = None) -> list[Tool]:
    """The tools of every ``Toolbox`` in ``module_name`` and of ``extra`` (an OpenAPI import's);
    a name served twice is an error."""
    tools: dict[str, Tool] = {}
    boxes = ([] if module_name is None else _toolboxes(module_name)) + ([] if extra is None else [extra])
    where = f"module {module_name!r}" if module_name else "the OpenAPI document"
    for box in boxes:
        for tool in box:
            if tool.name in tools:
                raise ToolDefinitionError(f"tool {tool.name!r}: defined twice (in {where} and the OpenAPI document)"
                                          if box is extra else
                                          f"tool {tool.name!r}: defined in two Toolboxes of {module_name!r}")
            tools[tool.name] = tool
    if not tools:
        raise ToolDefinitionError(f"{where} registers no tools")
    return list(tools.values())


def openapi_tools(args: argparse.Namespace) -> Toolbox | None:
    """The Toolbox of ``--openapi``'s operations, or None without it."""
    if args.openapi is None:
        if args.base_url is not None:
            raise ToolDefinitionError("--base-url is for --openapi SPEC")
        return None
    box = Toolbox()
    register(box, args.openapi, base_url=args.base_url, options=cli.options(args, os.environ))
    return box


def load_schedules(module_name: str | None) -> list[ScheduleSpec]:
    """The schedules of every ``Toolbox`` in ``module_name``; a name declared twice is an error
    (the store keeps one schedule per name)."""
    schedules: dict[str, ScheduleSpec] = {}
    for box in [] if module_name is None else _toolboxes(module_name):
        for spec in box.schedules:
            if spec.name in schedules:
                raise ToolDefinitionError(f"schedule {spec.name!r}: declared in two Toolboxes of {module_name!r}")
            schedules[spec.name] = spec
    return list(schedules.values())


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` on uvloop when it is installed (a dependency, as for the API under uvicorn),
    else on asyncio's own loop. uvloop's loop does the socket I/O in C: with one Redis write and
    read per step of an execution, most of a worker's time goes through it."""
    try:
        import uvloop
    except ImportError:  # a platform uvloop does not support (Windows, PyPy)
        asyncio.run(coro)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(coro)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m carmy_worker", description=__doc__)
    parser.add_argument("module", nargs="?", help="importable module with a Toolbox, e.g. examples.shop")
    cli.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.module is None and args.openapi is None:
        parser.error("give a MODULE, or --openapi SPEC --base-url URL, or both")
    try:
        settings = WorkerSettings.from_env()
        connector = RedisConnector(settings.redis_url, settings.redis_cluster_nodes)
        logs.configure(settings.log_format)
        tools = load_tools(args.module, openapi_tools(args))
        schedules = load_schedules(args.module)
    except (SettingsError, ToolDefinitionError, ImportError) as exc:
        print(f"carmy_worker: {exc}", file=sys.stderr)
        return 2
    collector.for_serving()
    heap.keep_freed_memory()
    try:
        run(serve(tools, settings, connector, schedules=schedules))
    except SettingsError as exc:  # found at start (a Redis too old to run the store's scripts)
        print(f"carmy_worker: {exc}", file=sys.stderr)
        return 2
    return 0


def leave(code: int) -> int:
    """``code``, once the threads still running have ended, or, after ``THREADS_GRACE_S``,
    the process's end with ``code`` without them. A sync tool's thread cannot be stopped: one
    that never returns (its caller long answered ``TIMEOUT``), or a thread a tool started and
    never ended, would otherwise hold the process at Python's exit, which joins them, for ever."""
    deadline = time.monotonic() + THREADS_GRACE_S
    left = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    for thread in left:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [t for t in left if t.is_alive()]
    if not left:
        return code
    log.warning("exiting without waiting for %d threads still running (%s): a sync tool that never returned, "
                "or a thread a tool started", len(left), ", ".join(sorted({t.name for t in left})))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(leave(main()))
