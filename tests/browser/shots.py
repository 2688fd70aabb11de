"""Screenshots the browser tests write, one PNG per page and state, for people to look at (and for
the README's picture of the overview): in ``CARMY_SCREENSHOTS``, else ``tests/browser/screenshots/``
(ignored by git)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from playwright.sync_api import Page

DEFAULT_DIR = Path(__file__).parent / "screenshots"
SHOTS = Path(os.environ.get("CARMY_SCREENSHOTS") or DEFAULT_DIR)
_written: list[Path] = []  # this run's, for the summary at its end


def screenshot(page: Page, name: str) -> Path:
    """The whole of ``page`` as it is now, in ``SHOTS/<name>.png``; its path. Name it after the page
    and its state ("overview", "sign-in-refused"): a later shot of the same name replaces it."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{safe(name)}.png"
    page.screenshot(path=path, full_page=True)
    if path not in _written:
        _written.append(path)
    return path


def safe(name: str) -> str:
    """``name`` as a file name: a test's node id has slashes, brackets and colons."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")


def clear_old_shots() -> None:
    """Remove the PNGs of an earlier run from the default folder, so that what is there is this
    run's. A folder named by CARMY_SCREENSHOTS (docs/, say) is never emptied."""
    if SHOTS == DEFAULT_DIR and SHOTS.is_dir():
        for old in SHOTS.glob("*.png"):
            old.unlink()


def written() -> list[Path]:
    """The screenshots this run wrote."""
    return list(_written)
