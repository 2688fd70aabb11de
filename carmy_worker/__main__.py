"""``python -m carmy_worker MODULE``: serve every Toolbox found in MODULE."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys

from carmy_worker import logs
from carmy_worker.runtime.service import serve
from carmy_worker.sdk.toolbox import Tool, Toolbox, ToolDefinitionError
from carmy_worker.settings import SettingsError, WorkerSettings
from carmy_worker.store.connect import RedisConnector


def load_tools(module_name: str) -> list[Tool]:
    """The tools of every ``Toolbox`` in ``module_name``; a name served twice is an error."""
    module = importlib.import_module(module_name)
    boxes = [value for value in vars(module).values() if isinstance(value, Toolbox)]
    if not boxes:
        raise ToolDefinitionError(f"module {module_name!r} has no Toolbox")
    tools: dict[str, Tool] = {}
    for box in boxes:
        for tool in box:
            if tool.name in tools and tools[tool.name] is not tool:
                raise ToolDefinitionError(f"tool {tool.name!r}: defined in two Toolboxes of {module_name!r}")
            tools[tool.name] = tool
    if not tools:
        raise ToolDefinitionError(f"module {module_name!r} registers no tools")
    return list(tools.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m carmy_worker", description=__doc__)
    parser.add_argument("module", help="importable module with a Toolbox, e.g. examples.shop")
    args = parser.parse_args(argv)
    try:
        settings = WorkerSettings.from_env()
        connector = RedisConnector(settings.redis_url)
        logs.configure(settings.log_format)
        tools = load_tools(args.module)
    except (SettingsError, ToolDefinitionError, ImportError) as exc:
        print(f"carmy_worker: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(tools, settings, connector))
    return 0


if __name__ == "__main__":
    sys.exit(main())
