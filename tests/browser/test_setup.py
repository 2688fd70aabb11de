"""The browser tests' own machinery, on what the API serves without the console: chromium loads a
page of the API, a screenshot is written, the browser enforces the API's Content-Security-Policy,
and a page of another origin can submit a form to the API (and is refused)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Page

from tests.browser.attacker import Attacker
from tests.browser.shots import screenshot
from tests.browser.stack import Console, console_stack

INLINE = """() => {
    const script = document.createElement('script');
    script.textContent = 'window.inlineRan = true';
    document.body.appendChild(script);
    return window.inlineRan === true;
}"""


@pytest.fixture(scope="module")
def console() -> Iterator[Console]:
    """With the API's own security headers on (off by default), whose CSP the browser must enforce."""
    with console_stack({"CARMY_SECURITY_HEADERS": "true"}) as c:
        yield c


def test_the_browser_loads_the_api_and_enforces_its_content_security_policy(
        console: Console, page: Page, page_problems: list[str]) -> None:
    response = page.goto(console.url("/health"))
    assert response is not None and response.status == 200
    assert "default-src 'none'" in response.headers["content-security-policy"]
    assert screenshot(page, "health").stat().st_size > 0
    # A script injected into the page (as an XSS would) does not run, and the browser says why.
    assert page.evaluate(INLINE) is False
    assert page_problems and all("Content Security Policy" in p for p in page_problems), page_problems
    page_problems.clear()


def test_a_form_of_another_origin_cannot_queue_a_job(console: Console, attacker: Attacker, page: Page) -> None:
    """The threat the console's CSRF defences answer, against what exists without it: a page
    elsewhere submits a form to the API in the browser of someone who can reach it."""
    action = console.url("/agent/jobs")
    response = attacker.attack(page, action, {"tool": "stamp", "arguments": "{}"})
    # Refused for its Origin, before its key or its body (a form's is never JSON) were looked at.
    assert (response.status, response.json()["error"]["code"]) == (403, "ORIGIN_NOT_ALLOWED")
    listed = console.http.get(console.url("/agent/jobs"), headers={"authorization": f"Bearer {console.operator_key}"})
    assert listed.status_code == 200 and listed.json()["jobs"] == []
