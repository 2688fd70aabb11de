"""Executions in the browser: a call made over HTTP appears in the open list within two seconds
of finishing, without a reload, and its page shows what became of it."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.browser.shots import screenshot
from tests.browser.stack import Console

PROMISE_MS = 2_000  # the "within two seconds"


def test_a_call_over_http_appears_in_the_open_executions_list(console: Console, operator_page: Page) -> None:
    page = operator_page
    page.goto(console.url("/console/executions"))
    expect(page.get_by_role("heading", name="Executions")).to_be_visible()
    execution_id = console.execute("stamp", {"name": "listed"})["execution_id"]
    row = page.locator("#executions-rows tr", has=page.locator(f'a[href^="/console/executions/{execution_id}"]'))
    expect(row).to_be_visible(timeout=PROMISE_MS)
    expect(row).to_contain_text("stamp")
    expect(row).to_contain_text("agent")  # the caller's principal, from the plain key
    screenshot(page, "executions")

    row.get_by_role("link").first.click()
    expect(page.get_by_role("heading", name=execution_id)).to_be_visible()
    expect(page.get_by_role("heading", name="Timeline")).to_be_visible()
    screenshot(page, "execution")
