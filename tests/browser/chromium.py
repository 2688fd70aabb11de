"""Debian's chromium under Playwright: launched from its path (``executable_path``), since
Playwright's own browser download cannot run here or in CI. bin/test installs the package."""

from __future__ import annotations

import os
from pathlib import Path

from playwright.sync_api import Browser, Playwright

# Another Chromium's path for a machine without Debian's (a developer's Chrome, say).
CHROMIUM = Path(os.environ.get("CARMY_CHROMIUM") or "/usr/bin/chromium")

# Milliseconds an action or a wait of a page may take before the test fails: generous, for a busy
# 2-core machine, since a condition met ends the wait at once. Navigations may take longer.
ACTION_TIMEOUT_MS = 10_000
NAVIGATION_TIMEOUT_MS = 20_000


def missing() -> str | None:
    """What to install, when there is no Chromium at ``CHROMIUM``."""
    if os.access(CHROMIUM, os.X_OK):
        return None
    return (f"the browser tests need Debian's chromium at {CHROMIUM}, which is missing: apt-get install chromium "
            "(bin/test installs it when run as root), or set CARMY_CHROMIUM to another Chromium's path")


def launch(playwright: Playwright) -> Browser:
    """A headless chromium (see ``missing`` first)."""
    # Playwright's default arguments include --no-sandbox (we may run as root) and headless mode.
    return playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
