"""Steps through the console that many browser tests share, done as a person does them."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.browser.stack import Console
from tests.support import wait_until

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


# Installs a watch in the page: the wall-clock ms (Date.now()) at which an element matching a
# selector first holds a text (or, with no text, first appears that was not there before), as the
# page's own script put it there (a MutationObserver runs as the DOM changes, before any paint,
# and whatever the test's process is doing meanwhile).
_WATCH = """([selector, text]) => {
  window.__carmySeen = null;
  const before = new Set(document.querySelectorAll(selector));
  const look = () => {
    for (const node of document.querySelectorAll(selector)) {
      if (text === null ? !before.has(node) : node.textContent.includes(text)) {
        window.__carmySeen = Date.now(); observer.disconnect(); return;
      }
    }
  };
  const observer = new MutationObserver(look);
  observer.observe(document.body, {childList: true, subtree: true, characterData: true});
  if (text !== null) look();
}"""


class Sighting:
    """When the page first showed a text in an element (or, ``text`` None, a new element), by
    the page's clock (Date.now(), ms): install it before the action, ask ``at_ms`` after."""

    def __init__(self, page: Page, selector: str, text: str | None = None) -> None:
        self.page = page
        self.text = text or selector
        page.evaluate(_WATCH, [selector, text])

    def at_ms(self, timeout: float = 15.0) -> int:
        """The instant, once it has happened (waiting up to ``timeout`` s). Asked by evaluating
        a function (the CSP's script-src refuses the string Playwright's wait_for_function evals)."""
        seen = wait_until(lambda: self.page.evaluate("() => window.__carmySeen"), timeout,
                          what=f"the page showing {self.text!r}")
        return int(seen)  # type: ignore[call-overload]
