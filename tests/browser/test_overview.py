"""The live overview in a browser, kept current over Server-Sent Events without a reload: a call
made over HTTP shows in it within two seconds, and a worker killed (-9) is shown dead within
seconds of its heartbeats stopping, then leaves it."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.browser.pages import Sighting
from tests.browser.shots import screenshot
from tests.browser.stack import Console

PROMISE_MS = 2_000  # the "within two seconds"
# A killed worker is dead once silent for dead_after (3 s), and shown so by the next frame (1 s).
DEAD_SHOWN_MS = 10_000
GONE_MS = 30_000  # the overview lists a dead worker a few seconds more, then drops it


def live(page: Page, console: Console) -> Page:
    """``page`` on the overview once its stream has delivered a frame: what the page shows from
    then on came over the stream, not with the page."""
    page.goto(console.url("/console"))
    expect(page.locator("#live-status")).to_contain_text("Live, as of")
    return page


def test_a_call_over_http_shows_in_the_live_overview_within_two_seconds(console: Console,
                                                                         operator_page: Page) -> None:
    page = live(operator_page, console)
    tools = page.locator("[data-table=tools]")
    expect(tools).not_to_contain_text("stamp")
    seen = Sighting(page, "[data-table=tools] tr", "stamp")
    done = console.execute("stamp", {"name": "overview"})
    # The promise is the page's: from the call's end (Redis's clock) to the page's script showing
    # it (the page's clock; one machine). Playwright's own polling, slow on a busy machine, is
    # not part of it.
    assert seen.at_ms() - console.finished_ms(done["execution_id"]) <= PROMISE_MS
    expect(tools.locator("tr", has_text="stamp")).to_be_visible()
    expect(page.locator("[data-field=workers]")).to_have_text("1 of 1")
    screenshot(page, "overview")


def test_a_killed_worker_is_shown_dead_then_leaves_the_overview(console: Console, operator_page: Page) -> None:
    page = live(operator_page, console)
    extra = console.start_worker()
    row = page.locator("[data-table=workers] tr", has_text=console.worker_id_prefix(extra))
    expect(row).to_contain_text("alive")
    expect(page.locator("[data-field=workers]")).to_have_text("2 of 2")
    console.kill_worker(extra)
    expect(row).to_contain_text("dead", timeout=DEAD_SHOWN_MS)
    expect(page.locator("[data-field=workers]")).to_have_text("1 of 2")
    screenshot(page, "overview-worker-dead")
    expect(row).to_have_count(0, timeout=GONE_MS)
    expect(page.locator("[data-field=workers]")).to_have_text("1 of 1")
