"""The README's picture of the overview: ``.venv/bin/python -m tests.browser.readme_shot``.

Starts the browser tests' stack (a private Redis, the API with the console on, workers of
``tests.toolsets.jobs``), sends it a steady mixed load for ``SECONDS`` (quick calls from a few
agents, some slow ones holding slots, some refused for good, jobs, two of them dead letters),
signs in as the operator in Debian's chromium and writes ``docs/console-overview.png``. Run it
again after changing the overview; it is not a test (nothing here is asserted)."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from tests.browser.chromium import launch
from tests.browser.pages import sign_in
from tests.browser.stack import PLAIN_KEY, Console, bearer, console_stack

SECONDS = 45.0
OUT = Path(__file__).resolve().parents[2] / "docs" / "console-overview.png"


def agent(console: Console, halt: threading.Event, seed: int) -> None:
    """One agent's calls: mostly quick stamps, now and then a slow one or one refused for good."""
    rng = random.Random(seed)
    with httpx.Client(timeout=30) as http:
        while not halt.is_set():
            roll = rng.random()
            tool, work = ("refuse", {"name": f"r{seed}"}) if roll < 0.08 else (
                ("sync_mirror", {"name": f"s{seed}", "seconds": rng.uniform(0.5, 2.0)}) if roll < 0.2 else
                ("stamp", {"name": f"a{seed}-{rng.random()}"}))
            http.post(console.url("/agent/execute"), json={"tool": tool, "arguments": work}, headers=bearer(PLAIN_KEY))
            halt.wait(rng.uniform(0.02, 0.15))


def main() -> None:
    with console_stack() as console:
        console.start_worker()
        halt = threading.Event()
        agents = [threading.Thread(target=agent, args=(console, halt, i), daemon=True) for i in range(6)]
        for a in agents:
            a.start()
        for i in range(2):
            console.create_job("flaky", {"name": f"dead-{i}", "fail_times": 1000})
        for i in range(5):
            console.create_job("stamp", {"name": f"later-{i}"}, delay_ms=60_000)
        with sync_playwright() as pw:
            browser = launch(pw)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            sign_in(page, console)
            time.sleep(SECONDS)  # the charts fill with the load's minutes; a picture, not a test
            page.screenshot(path=OUT, full_page=False)
            browser.close()
        halt.set()
        for a in agents:
            a.join(35)  # before the stack stops under their calls
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
