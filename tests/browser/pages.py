"""Steps through the console that many browser tests share, done as a person does them."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.browser.stack import Console

SIGN_IN = "/console/sign-in"
TOKEN_FIELD = "API key or access token"  # the sign-in form's label


def sign_in(page: Page, console: Console, key: str | None = None) -> None:
    """Paste ``key`` (the operator's by default) into the sign-in form and send it; returns once the
    browser has left the form for the overview. For a key that should be refused, ``submit_key``."""
    submit_key(page, console, key or console.operator_key)
    expect(page).to_have_url(console.url("/console"))


def submit_key(page: Page, console: Console, key: str) -> None:
    """Paste ``key`` into the sign-in form and send it, whatever comes of it."""
    page.goto(console.url(SIGN_IN))
    page.get_by_label(TOKEN_FIELD).fill(key)
    page.get_by_role("button", name="Sign in").click()
