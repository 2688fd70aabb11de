"""The Tools page in a browser, reached from the nav: every tool the workers serve, with its
badges, its schemas (opened on demand) and the workers serving it."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.browser.shots import screenshot
from tests.browser.stack import Console


def test_the_tools_page_shows_each_tool_its_badges_schemas_and_workers(console: Console,
                                                                       operator_page: Page) -> None:
    page = operator_page
    page.get_by_role("navigation", name="Sections").get_by_role("link", name="Tools").click()
    expect(page).to_have_url(console.url("/console/tools"))
    charge, stamp = page.locator("#tool-charge"), page.locator("#tool-stamp")
    expect(charge.locator(".badge.effect-external_write")).to_be_visible()
    expect(charge.locator(".badges")).to_contain_text("not idempotent")
    expect(stamp.locator(".badges").get_by_text("idempotent", exact=True)).to_be_visible()
    expect(stamp.locator(".served")).to_contain_text(console.worker_id_prefix(console.workers[0]))
    flaky = page.locator("#tool-flaky")
    schema = flaky.locator(".schemas pre").first  # the input schema
    expect(schema).to_be_hidden()  # inside a closed <details> until asked for
    flaky.get_by_text("Input schema").click()
    expect(schema).to_be_visible()
    expect(schema).to_contain_text("fail_times")
    screenshot(page, "tools")
