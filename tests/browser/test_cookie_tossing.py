"""Cookie tossing: a page of a sibling subdomain sets a cookie of the console's name for the whole
domain, which the browser then sends to the console along with the operator's own, and the
console would read whichever came last. With a Secure cookie the console's is
``__Host-carmy_console``: Chromium refuses that name with a ``Domain``, and the console reads no
other name.

The console here is ``http://console.carmy.localhost`` with ``CARMY_CONSOLE_SECURE_COOKIES`` (as
behind a proxy that ends TLS) and the attacker ``http://evil.carmy.localhost`` on another port:
Chromium sends every ``*.localhost`` to loopback and counts it a secure context, so it keeps
``Secure`` and ``__Host-`` cookies there as over https, without a certificate.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, expect

from tests.browser.attacker import Attacker
from tests.browser.pages import TOKEN_FIELD
from tests.browser.stack import Console, console_stack

CONSOLE_HOST = "console.carmy.localhost"
EVIL_HOST = "evil.carmy.localhost"
SECURE_COOKIE = "__Host-carmy_console"


@pytest.fixture(scope="module")
def console() -> Iterator[Console]:
    env = {"CARMY_CONSOLE_SECURE_COOKIES": "1", "CARMY_ALLOWED_HOSTS": f"{CONSOLE_HOST},127.0.0.1"}
    with console_stack(env) as c:
        yield c


def site(console: Console) -> str:
    """The console as the browser reaches it (the test's own calls use 127.0.0.1)."""
    return f"http://{CONSOLE_HOST}:{urlsplit(console.base).port}"


def signed_in(page: Page, console: Console) -> str:
    """Sign in at the console's name; the session cookie's value."""
    page.goto(site(console) + "/console/sign-in")
    page.get_by_label(TOKEN_FIELD).fill(console.operator_key)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(site(console) + "/console")
    [cookie] = [c for c in page.context.cookies() if c["name"] == SECURE_COOKIE]
    assert (cookie["domain"], cookie["path"], cookie["secure"], cookie["httpOnly"], cookie["sameSite"]) == \
        (CONSOLE_HOST, "/", True, True, "Strict")
    return cookie["value"]


def toss(page: Page, attacker: Attacker, *cookies: str) -> None:
    """The attacker's page, at a sibling subdomain, sets ``cookies`` from its script."""
    attacker.pages["/toss"] = "<!doctype html><title>Nothing to see</title>"
    page.goto(f"http://{EVIL_HOST}:{urlsplit(attacker.base).port}/toss")
    for cookie in cookies:
        page.evaluate("(cookie) => { document.cookie = cookie; }", cookie)


def test_a_sibling_subdomain_cannot_shadow_the_session(console: Console, attacker: Attacker, page: Page) -> None:
    mine = signed_in(page, console)
    toss(page, attacker,
         # Refused by the browser: a __Host- cookie has no Domain.
         f"{SECURE_COOKIE}=tossed; Domain=carmy.localhost; Path=/; Secure",
         # Taken, and sent to the console after the operator's (it is newer): the name the console
         # read before, now never looked at when the cookie is Secure.
         "carmy_console=tossed; Domain=carmy.localhost; Path=/console")
    by_domain = {(c["name"], c["domain"]): c["value"] for c in page.context.cookies()}
    assert (SECURE_COOKIE, ".carmy.localhost") not in by_domain
    assert by_domain[("carmy_console", ".carmy.localhost")] == "tossed"
    with page.expect_response(lambda r: r.url == site(console) + "/console/tools") as answered:
        page.goto(site(console) + "/console/tools")
    assert "carmy_console=tossed" in (answered.value.request.all_headers().get("cookie") or "")
    expect(page).to_have_url(site(console) + "/console/tools")  # not sent to sign in
    expect(page.get_by_text("Signed in as")).to_contain_text("ops")
    assert by_domain[(SECURE_COOKIE, CONSOLE_HOST)] == mine
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(site(console) + "/console/sign-in")
    # The sign-in form's anonymous session in its place, under the same name and path.
    assert [c["value"] for c in page.context.cookies() if c["name"] == SECURE_COOKIE] != [mine]
