"""A dead-lettered job retried in the browser, as an operator would: found among the dead letters,
opened, Retry, the confirmation read, the button pressed; the job then runs again, for real."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.browser.shots import screenshot
from tests.browser.stack import Console


def test_an_operator_retries_a_dead_lettered_job_with_the_button(console: Console, operator_page: Page) -> None:
    page = operator_page
    job_id = console.dead_letter("retried-in-browser", fail_times=3)["job_id"]  # its 4th run succeeds
    page.goto(console.url("/console/jobs?status=dead_lettered"))
    row = page.locator("tr", has=page.locator(f'a[href="/console/jobs/{job_id}"]'))
    expect(row).to_contain_text("3 of 3")
    expect(row).to_contain_text("UPSTREAM_BUSY")
    screenshot(page, "jobs-dead-lettered")

    row.get_by_role("link").click()
    page.get_by_role("link", name="Retry", exact=True).click()
    expect(page.get_by_role("heading", name="Retry this job?")).to_be_visible()
    screenshot(page, "job-retry-confirm")
    page.get_by_role("button", name="Retry the job").click()

    expect(page).to_have_url(console.url(f"/console/jobs/{job_id}?done=retried"))
    expect(page.get_by_role("status")).to_be_visible()
    screenshot(page, "job-retried")
    assert (done := console.finished(job_id))["status"] == "succeeded", done
    page.reload()
    expect(page.locator(".facts")).to_contain_text("succeeded")
    expect(page.get_by_role("link", name="Retry", exact=True)).to_have_count(0)
