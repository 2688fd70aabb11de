"""deploy/Dockerfile and .dockerignore, read as text: no Docker engine is needed to check them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from tests.support import ROOT, Stack, free_port

Instruction = tuple[str, str]


def instructions(text: str) -> list[Instruction]:
    """(KEYWORD, arguments) of each instruction, continuation lines joined, comments dropped."""
    out: list[Instruction] = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        keyword, _, args = (current + stripped).partition(" ")
        out.append((keyword.upper(), args.strip()))
        current = ""
    return out


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return instructions((ROOT / "deploy" / "Dockerfile").read_text())


def only(dockerfile: list[Instruction], keyword: str) -> list[str]:
    return [args for k, args in dockerfile if k == keyword]


def test_base_is_python_311_slim(dockerfile: list[Instruction]) -> None:
    assert dockerfile[0][0] == "FROM"
    assert only(dockerfile, "FROM") == ["python:3.11-slim"]


def test_runs_as_an_unprivileged_user(dockerfile: list[Instruction]) -> None:
    users = only(dockerfile, "USER")
    assert users, "no USER: the processes would run as root"
    assert users[-1].split(":")[0] not in {"root", "0"}
    # Nothing after the switch runs as root again.
    last_user = max(i for i, (k, _) in enumerate(dockerfile) if k == "USER")
    assert all(k != "RUN" for k, _ in dockerfile[last_user:])


def test_python_does_not_buffer_output_or_write_bytecode(dockerfile: list[Instruction]) -> None:
    env = " ".join(only(dockerfile, "ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "PYTHONUNBUFFERED=1" in env


def test_dependencies_are_installed_before_the_source_is_copied(dockerfile: list[Instruction]) -> None:
    """So a change to the code reuses the cached dependency layer."""
    copies = [(i, args.split()[:-1]) for i, (k, args) in enumerate(dockerfile) if k == "COPY"]
    installs = [(i, args) for i, (k, args) in enumerate(dockerfile) if k == "RUN" and "pip install" in args]
    first_copy, sources = copies[0]
    assert sources == ["pyproject.toml"]
    source_copy = next(i for i, srcs in copies if set(srcs) & {".", "carmy_worker", "api"})
    deps = [i for i, _ in installs if first_copy < i < source_copy]
    assert deps, "no pip install between copying pyproject.toml and copying the source"
    later = [args for i, args in installs if i > source_copy]
    assert later and all("--no-deps" in args for args in later)


def test_no_development_tools_are_installed(dockerfile: list[Instruction]) -> None:
    runs = " ".join(only(dockerfile, "RUN"))
    for tool in ("pytest", "ruff", "mypy", "hypothesis", "[test]", ".[", "optional-dependencies"):
        assert tool not in runs
    dependencies = " ".join(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    for tool in ("pytest", "ruff", "mypy"):
        assert tool not in dependencies


def test_default_command_is_the_api_on_port_8000(dockerfile: list[Instruction]) -> None:
    assert [json.loads(args) for args in only(dockerfile, "CMD")] == [["python", "-m", "api"]]
    assert only(dockerfile, "EXPOSE") == ["8000"]


def healthcheck_command(dockerfile: list[Instruction]) -> str:
    (check,) = only(dockerfile, "HEALTHCHECK")
    _, _, command = check.partition(" CMD ")
    assert command, f"HEALTHCHECK without CMD: {check!r}"
    return command


def run_check(command: str, port: int) -> int:
    # `python` of the image is this interpreter here.
    env = {**os.environ, "CARMY_PORT": str(port), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["sh", "-c", command], env=env, capture_output=True, timeout=15).returncode


@pytest.mark.slow
def test_healthcheck_passes_on_a_live_api_and_fails_without_one(dockerfile: list[Instruction], stack: Stack) -> None:
    command = healthcheck_command(dockerfile)
    assert "/health" in command
    _, base = stack.api()
    assert run_check(command, int(base.rsplit(":", 1)[1])) == 0
    assert run_check(command, free_port()) != 0


# -- .dockerignore ---------------------------------------------------------------------------

def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule for the patterns this file uses: the last matching pattern wins, a pattern
    matching a directory matches everything in it, ``!`` lets a path back in."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.removeprefix("!").strip("/")
        if glob.startswith("**/"):
            hit = any(fnmatchcase(p.rsplit("/", 1)[-1], glob[3:]) for p in prefixes)
        else:
            hit = any(fnmatchcase(p, glob) for p in prefixes)
        if hit:
            result = not negated
    return result


@pytest.fixture(scope="module")
def ignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


@pytest.mark.parametrize("path", [
    ".env", ".venv/bin/python", ".git/HEAD", "tests/conftest.py", "var/redis.log",
    ".pytest_cache/README.md", "api/__pycache__/app.cpython-311.pyc", "carmy.egg-info/PKG-INFO",
])
def test_local_files_stay_out_of_the_build_context(ignore_patterns: list[str], path: str) -> None:
    assert ignored(path, ignore_patterns)


def test_every_installed_package_is_in_the_build_context(ignore_patterns: list[str]) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]]
    assert "carmy_worker" in packages
    for package in packages:
        for source in (ROOT / package).rglob("*.py"):
            assert not ignored(str(source.relative_to(ROOT)), ignore_patterns), source
    assert not ignored("pyproject.toml", ignore_patterns)
    assert not ignored("README.md", ignore_patterns)


def test_a_tool_module_of_ones_own_needs_its_own_line(ignore_patterns: list[str]) -> None:
    """README, "Run it": ``COPY mytools.py /app/`` finds the module only once ``!mytools.py`` lets
    it into the build context."""
    assert ignored("mytools.py", ignore_patterns)
    assert not ignored("mytools.py", [*ignore_patterns, "!mytools.py"])
