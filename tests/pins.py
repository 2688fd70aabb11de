"""The version ranges ``pyproject.toml`` pins, for the tests of a dependency's private surface:
the installed release must be one the range allows, and the range must have an upper bound."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def pinned(distribution: str) -> Requirement:
    """The requirement ``pyproject.toml`` lists for ``distribution``."""
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    wanted = canonicalize_name(distribution)
    found = [r for r in map(Requirement, dependencies) if canonicalize_name(r.name) == wanted]
    if len(found) != 1:
        raise AssertionError(f"pyproject.toml lists {distribution} {len(found)} times, not once")
    return found[0]


def assert_tested_release(distribution: str) -> None:
    """``distribution`` is pinned with an upper bound, and the installed release is within it."""
    specifier = pinned(distribution).specifier
    assert any(s.operator in ("<", "<=", "==", "~=") for s in specifier), (
        f"{distribution} {specifier}: its private names are used, so its range needs an upper bound")
    installed = importlib.metadata.version(distribution)
    assert specifier.contains(installed, prereleases=True), (
        f"{distribution} {installed} is installed, but pyproject.toml allows {specifier}: re-run this "
        "surface test against it and move the range")
