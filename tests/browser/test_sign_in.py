"""Signing in to the console in a browser: an operator's key opens it, any other key is refused
with a message on the page, and the console is never shown to a browser that did not sign in."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.browser.pages import SIGN_IN, TOKEN_FIELD, sign_in, submit_key
from tests.browser.shots import screenshot
from tests.browser.stack import Console


def test_the_console_sends_a_browser_that_has_not_signed_in_to_the_sign_in_form(console: Console,
                                                                                page: Page) -> None:
    response = page.goto(console.url("/console"))
    expect(page).to_have_url(console.url(SIGN_IN))
    assert response is not None and response.status == 200
    # The console's own policy reaches the browser (the page fixture fails on any violation of it).
    policy = response.headers["content-security-policy"]
    assert "'unsafe-inline'" not in policy.split("script-src", 1)[-1].split(";")[0], policy
    expect(page.get_by_label(TOKEN_FIELD)).to_be_visible()
    screenshot(page, "sign-in")


def test_an_operator_signs_in_with_a_key_and_lands_on_the_overview(console: Console, page: Page) -> None:
    sign_in(page, console)
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    expect(page.get_by_text("Signed in as")).to_contain_text("ops")
    screenshot(page, "signed-in")
    # The session is a cookie the page's scripts cannot read.
    cookie = next(c for c in page.context.cookies() if c["name"] == "carmy_console")
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, "Strict", "/console")


def test_a_key_without_the_operator_permission_is_refused_on_the_page(console: Console, page: Page) -> None:
    submit_key(page, console, console.plain_key)
    expect(page.get_by_role("alert")).to_contain_text("operator permission")
    screenshot(page, "sign-in-refused")
    page.goto(console.url("/console"))
    expect(page).to_have_url(console.url(SIGN_IN))  # still not let in


def test_a_wrong_key_is_refused_on_the_page(console: Console, page: Page) -> None:
    submit_key(page, console, "not-a-key-of-this-server-0123")
    expect(page.get_by_role("alert")).to_contain_text("not a valid API key")
    page.goto(console.url("/console"))
    expect(page).to_have_url(console.url(SIGN_IN))


def test_signing_out_ends_the_session(console: Console, operator_page: Page) -> None:
    page = operator_page
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(console.url(SIGN_IN))
    page.goto(console.url("/console"))
    expect(page).to_have_url(console.url(SIGN_IN))
