"""docs/architecture.md, section 2 ("Package layout"): the listing names every module of both
packages, and names none that is gone. A module added without its line leaves the one map of
the code a reader has silently short (store/reach.py went unlisted)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("carmy_worker", "api")
DESCRIPTION_COLUMN = 25  # where each entry's text starts; a line indented this far continues the one above


def listing() -> list[str]:
    """The lines of section 2's code block."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## 2. Package layout", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1].splitlines()


def listed_paths(lines: list[str]) -> set[str]:
    """Every path an entry names: a folder's entries are indented two spaces under it, and an
    entry may name a file in a subfolder (``pages/overview.py``)."""
    folders: list[str] = []
    paths: set[str] = set()
    for line in lines:
        match = re.match(r"( *)(\S+)", line)
        if not match or len(match.group(1)) >= DESCRIPTION_COLUMN:
            continue
        depth, name = len(match.group(1)) // 2, match.group(2)
        del folders[depth:]
        if name.endswith(","):  # "templates/, static/": not Python
            continue
        path = "".join(folders) + name
        paths.add(path.rstrip("/"))
        if name.endswith("/"):
            folders.append(name)
    return paths


def test_the_parser_follows_folders() -> None:
    lines = ["a/       x", "  b.py   x", "  c/     x", "    d.py x", "    e/f.py", "  g.py   x", "h.py"]
    assert listed_paths(lines) == {"a", "a/b.py", "a/c", "a/c/d.py", "a/c/e/f.py", "a/g.py", "h.py"}


def test_every_module_is_listed_and_every_listed_module_exists() -> None:
    listed = listed_paths(listing())
    modules = {str(p.relative_to(ROOT)) for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    unlisted = sorted(m for m in modules if m not in listed and not m.endswith("/__init__.py"))
    gone = sorted(p for p in listed if p.endswith(".py") and p not in modules)
    assert (unlisted, gone) == ([], [])
