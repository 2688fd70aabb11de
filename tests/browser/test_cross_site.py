"""Another site's page cannot act in the console for the operator whose browser visits it: its form
posts are refused (403) and nothing changes. Both kinds of attacker are tried: a page on the same
host and another port (same-site: even a SameSite=Strict cookie goes along, and only the
console's Origin check and CSRF token stand in the way) and one under another name (cross-site)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.browser.attacker import CROSS_SITE, SAME_SITE, Attacker
from tests.browser.pages import SIGN_IN, sign_in
from tests.browser.shots import screenshot
from tests.browser.stack import Console

SITES = pytest.mark.parametrize("site", [SAME_SITE, CROSS_SITE])


@SITES
def test_another_sites_form_cannot_sign_the_operator_out(console: Console, attacker: Attacker,
                                                         operator_page: Page, site: str) -> None:
    page = operator_page
    response = attacker.attack(page, console.url("/console/sign-out"), {}, site)
    assert response.status == 403
    # Same-site, the browser did send the session along: refused all the same.
    assert ("carmy_console=" in (response.request.all_headers().get("cookie") or "")) is (site == SAME_SITE)
    screenshot(page, f"cross-site-refused-{'same-site' if site == SAME_SITE else 'cross-site'}")
    page.goto(console.url("/console"))
    expect(page).to_have_url(console.url("/console"))  # still signed in
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()


@SITES
def test_another_sites_form_cannot_sign_a_browser_in(console: Console, attacker: Attacker, page: Page,
                                                     site: str) -> None:
    """Login CSRF: a browser signed in to the attacker's session would show the operator what the
    attacker chooses, and record what they do under the attacker's name."""
    response = attacker.attack(page, console.url(SIGN_IN), {"token": console.operator_key}, site)
    assert response.status == 403
    assert not [c for c in page.context.cookies() if c["name"] == "carmy_console"]
    page.goto(console.url("/console"))
    expect(page).to_have_url(console.url(SIGN_IN))


@SITES
def test_another_sites_form_cannot_retry_a_dead_letter(console: Console, attacker: Attacker, operator_page: Page,
                                                       site: str) -> None:
    """What the Retry button does (its tool runs again: a charge, a message sent), asked for by
    another site's page while the operator is signed in."""
    dead = console.dead_letter(f"cross-{site}")
    response = attacker.attack(operator_page, console.url(f"/console/jobs/{dead['job_id']}/retry"), {}, site)
    assert response.status == 403
    after = console.job(dead["job_id"])
    assert (after["status"], after["attempts"]) == ("dead_lettered", dead["attempts"])


@SITES
def test_a_link_from_another_site_neither_signs_the_operator_out_nor_asks_them_to_sign_in(
        console: Console, attacker: Attacker, operator_page: Page, site: str) -> None:
    """A link to a console page in an alert, a chat or any other site's page: cross-site, the browser
    leaves the SameSite=Strict cookie home on that navigation, so the console did not know the
    operator and answered with the sign-in form and a new anonymous cookie, which replaced the
    operator's session (a GET that signed them out, which any site could make happen)."""
    page = operator_page
    page.goto(attacker.link_to(console.url("/console/jobs?status=failed"), site))
    page.locator("#link").click()
    expect(page.get_by_role("heading", name="Jobs")).to_be_visible()
    expect(page).to_have_url(console.url("/console/jobs?status=failed"))
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    page.goto(console.url("/console/executions"))
    expect(page).to_have_url(console.url("/console/executions"))  # still signed in afterwards


def test_a_link_from_another_site_takes_a_browser_not_signed_in_to_the_sign_in_form(
        console: Console, attacker: Attacker, page: Page) -> None:
    page.goto(attacker.link_to(console.url("/console/jobs"), CROSS_SITE))
    page.locator("#link").click()
    expect(page).to_have_url(console.url(SIGN_IN))
    sign_in(page, console)  # its form works: the cookie its token is bound to was set
