"""The console's Executions and Jobs pages in a browser: a call made over HTTP appears in the
executions list within two seconds without a reload, and its page shows it; a dead-lettered job
is retried with its button (Retry, then the confirmation) and succeeds; a scheduled job is
cancelled the same way. Screenshots of every page are written on the way."""

from __future__ import annotations

import uuid

from playwright.sync_api import Page, expect

from tests.browser.pages import Sighting
from tests.browser.shots import screenshot
from tests.browser.stack import Console, bearer


def test_a_call_over_http_appears_in_the_executions_list_within_two_seconds(console: Console,
                                                                             operator_page: Page) -> None:
    page = operator_page
    page.goto(console.url("/console/executions"))
    expect(page.get_by_role("heading", name="Executions")).to_be_visible()
    name = f"seen-{uuid.uuid4().hex[:8]}"
    seen = Sighting(page, 'a[href^="/console/executions/exec_"]')  # a row the page had not
    answer = console.execute("stamp", {"name": name})
    link = page.locator(f'a[href^="/console/executions/{answer["execution_id"]}"]')
    # No reload: executions.js fetched the rows again. The promise is the page's, from the call's
    # end (Redis's clock) to the page's script showing the row (the page's; one machine), not
    # Playwright's polling, slow on a busy machine.
    assert seen.at_ms() - console.finished_ms(answer["execution_id"]) <= 2_000
    expect(link).to_be_visible()
    screenshot(page, "executions")
    link.click()
    expect(page.get_by_role("heading", name=answer["execution_id"])).to_be_visible()
    expect(page.locator(".timeline")).to_contain_text("Finished")
    expect(page.locator(".facts")).to_contain_text("stamp")
    expect(page.get_by_text("Completed, with")).to_be_visible()
    assert name not in page.content()  # neither its arguments nor its output
    screenshot(page, "execution")


def test_a_failed_call_shows_its_error_and_the_list_filters(console: Console, operator_page: Page) -> None:
    page = operator_page
    failed = console.http.post(console.url("/agent/execute"), headers=bearer(console.plain_key),
                               json={"tool": "refuse", "arguments": {"name": "nope"}}).json()
    assert failed["status"] == "failed", failed
    page.goto(console.url("/console/executions"))
    page.get_by_label("Tool").select_option("refuse")
    page.get_by_label("Status").select_option("failed")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(console.url("/console/executions?tool=refuse&status=failed&principal="))
    expect(page.locator("#executions-rows tr").first).to_contain_text("BAD_INPUT")
    screenshot(page, "executions-filtered")
    page.goto(console.url(f"/console/executions/{failed['execution_id']}"))
    expect(page.locator(".error-box")).to_contain_text("this job can never succeed")
    screenshot(page, "execution-failed")


def test_a_dead_lettered_job_is_retried_with_the_button(console: Console, operator_page: Page) -> None:
    page = operator_page
    # flaky fails its first 3 runs of a name: 3 attempts, then a dead letter; the 4th run succeeds.
    name = f"retry-{uuid.uuid4().hex[:8]}"
    job_id = console.create_job("flaky", {"name": name, "fail_times": 3})["job_id"]
    console.finished(job_id, "dead_lettered")
    page.goto(console.url("/console/jobs?status=dead_lettered"))
    screenshot(page, "jobs-dead-lettered")
    page.locator(f'a[href="/console/jobs/{job_id}"]').click()
    expect(page.locator(".facts")).to_contain_text("dead lettered")
    expect(page.locator(".error-box")).to_contain_text("UPSTREAM_BUSY")
    screenshot(page, "job-dead-lettered")
    page.get_by_role("link", name="Retry").click()
    expect(page).to_have_url(console.url(f"/console/jobs/{job_id}/retry"))
    screenshot(page, "job-retry-confirm")
    page.get_by_role("button", name="Retry the job").click()
    expect(page).to_have_url(console.url(f"/console/jobs/{job_id}?done=retried"))
    expect(page.get_by_role("status")).to_contain_text("queued again")
    screenshot(page, "job-retried")
    job = console.finished(job_id, "succeeded")
    assert job["attempts"] == 4
    page.reload()
    expect(page.locator(".facts")).to_contain_text("succeeded")
    expect(page.locator(".attempts li")).to_have_count(4)
    screenshot(page, "job-succeeded")


def test_a_scheduled_job_is_cancelled_with_the_button(console: Console, operator_page: Page) -> None:
    page = operator_page
    job_id = console.create_job("stamp", {"name": f"later-{uuid.uuid4().hex[:8]}"}, delay_ms=600_000)["job_id"]
    page.goto(console.url("/console/jobs?status=scheduled"))
    expect(page.locator(f'a[href="/console/jobs/{job_id}"]')).to_be_visible()
    screenshot(page, "jobs-scheduled")
    page.goto(console.url(f"/console/jobs/{job_id}"))
    page.get_by_role("link", name="Cancel").click()
    expect(page.get_by_role("heading", name="Cancel this job?")).to_be_visible()
    screenshot(page, "job-cancel-confirm")
    page.get_by_role("button", name="Cancel the job").click()
    expect(page).to_have_url(console.url(f"/console/jobs/{job_id}?done=cancelled"))
    expect(page.locator(".facts")).to_contain_text("cancelled")
    assert console.job(job_id)["status"] == "cancelled"
