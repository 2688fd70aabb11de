"""The import graph has three layers, and the API stands on the lower two only.

``carmy_worker.sdk`` (what tool authors import) and ``carmy_worker.store`` (an execution's state
machine in Redis) are shared; ``carmy_worker.runtime`` is the worker process and the only code
that may import arq. The API never imports the runtime or arq, so it can be deployed, and arq
replaced, independently.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package (or module) -> prefixes it must never import, directly
FORBIDDEN = {
    "api": ("carmy_worker.runtime", "arq"),
    "carmy_worker.sdk": ("carmy_worker.store", "carmy_worker.runtime", "arq", "redis", "api"),
    "carmy_worker.store": ("carmy_worker.runtime", "arq", "api"),
    "carmy_worker.wire": ("carmy_worker.sdk", "carmy_worker.store", "carmy_worker.runtime", "arq", "redis", "api"),
    "carmy_worker.runtime": ("api",),
    # An OpenAPI import is tools, as a module of hand-written ones: it stands on the SDK alone.
    "carmy_worker.openapi": ("carmy_worker.store", "carmy_worker.runtime", "arq", "redis", "api"),
}


def modules(package: str) -> list[tuple[str, Path]]:
    path = ROOT / package.replace(".", "/")
    files = [path.with_suffix(".py")] if path.with_suffix(".py").exists() else sorted(path.rglob("*.py"))
    return [(str(f.relative_to(ROOT).with_suffix("")).replace("/", "."), f) for f in files]


def imported(file: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_crosses_a_layer(package: str) -> None:
    crossings = [
        f"{module} imports {name}"
        for module, file in modules(package)
        for name in sorted(imported(file))
        if any(name == p or name.startswith(p + ".") for p in FORBIDDEN[package])
    ]
    assert crossings == []


# The API's rooms, lowest first: a module may import its own room and the rooms before it, never
# one after it. app.py and __main__.py, at the top, put them together (docs/architecture.md).
API_ROOMS = ("api.settings", "api.http", "api.serving", "api.guards", "api.events", "api.calling",
             "api.endpoints", "api.mcp", "api.console")
API_TOP = ("api.app", "api.__main__", "api")


def room_of(module: str) -> int:
    for i, room in enumerate(API_ROOMS):
        if module == room or module.startswith(room + "."):
            return i
    return len(API_ROOMS)  # the top: app, __main__, the package itself


def test_every_api_module_is_in_a_room() -> None:
    loose = [module for module, _ in modules("api") if room_of(module) == len(API_ROOMS)
             and module.removesuffix(".__init__") not in API_TOP]
    assert loose == []


def test_no_api_room_imports_a_higher_one() -> None:
    upward = [
        f"{module} imports {name}"
        for module, file in modules("api")
        for name in sorted(imported(file))
        if name.startswith("api.") and room_of(name) > room_of(module)
    ]
    assert upward == []


def test_only_the_queue_module_imports_arq() -> None:
    users = [module for module, file in modules("carmy_worker") if any(
        name == "arq" or name.startswith("arq.") for name in imported(file))]
    assert users == ["carmy_worker.runtime.queue"]


@pytest.mark.slow
def test_the_api_builds_and_serves_routes_with_arq_unimportable() -> None:
    """Not only no direct import: nothing the API loads, however indirectly, pulls arq or the runtime in."""
    script = """
import sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name == "arq" or name.startswith("arq."):
            raise ImportError("arq is blocked in this test")
        return None

sys.meta_path.insert(0, Blocked())
import api.__main__
from api.app import create_app
from api.settings import ApiSettings
create_app(ApiSettings(redis_url="redis://127.0.0.1:1/0"))
loaded = sorted(m for m in sys.modules if m.startswith("carmy_worker.runtime") or m.startswith("arq"))
print(",".join(loaded))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_the_tool_sdk_is_importable_from_the_package_root() -> None:
    import carmy_worker

    assert sorted(carmy_worker.__all__) == ["AgentContext", "Context", "RetryPolicy", "Tool", "ToolDefinitionError",
                                           "ToolError", "Toolbox"]


# What running or defining a Lua script looks like in source.
SCRIPT_CALLS = ("register_script(", "evalsha(", "EVALSHA", ".eval(", "script_load(", "Script(")


def test_only_the_store_defines_or_runs_lua_scripts() -> None:
    """The store owns every key: no module outside ``carmy_worker.store`` defines, registers or
    evaluates a script (docs/architecture.md, "The store owns every key")."""
    outside = [
        f"{module}: {call}"
        for package in ("api", "carmy_worker")
        for module, file in modules(package)
        if not module.startswith("carmy_worker.store.")
        for call in SCRIPT_CALLS if call in file.read_text()
    ]
    assert outside == []


# What reading Redis state looks like in source: the API asks the store's views instead
# (store.reads, store.metrics.snapshot, store.roster.worker_infos, store.memory, store.version).
REDIS_READS = (".pipeline(", ".get(keys.", ".hget(", ".hmget(", ".hgetall(", ".mget(", ".zcard(", ".zrange",
               ".smembers(", ".execute_command(", "redis.info(")


def test_the_api_reads_redis_only_through_store_views() -> None:
    direct = [f"{module}: {call}" for module, file in modules("api") for call in REDIS_READS
              if call in file.read_text()]
    assert direct == []
