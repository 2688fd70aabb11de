"""Fixtures of the browser tests (see ``__init__.py``): a chromium per module, a fresh context
and page per test, the console's processes per module, and an attacker's site."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Playwright, expect, sync_playwright

from tests.browser import shots
from tests.browser.attacker import Attacker, attacker_site
from tests.browser.chromium import ACTION_TIMEOUT_MS, NAVIGATION_TIMEOUT_MS, launch, missing
from tests.browser.pages import sign_in
from tests.browser.stack import Console, console_stack

HERE = Path(__file__).parent
FAILED = pytest.StashKey[bool]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Here rather than in each module, so that no browser test can miss them: the quick loop
    # (-m "not e2e and not slow") leaves these out, CI runs them.
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.browser)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                                            pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True  # for the page fixture: a screenshot of what the test saw
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if written := shots.written():
        terminalreporter.write_line(f"browser screenshots: {len(written)} in {shots.SHOTS}")


# Module-scoped, not session: while Playwright's sync API is started, its event loop counts as
# running in the main thread, and every async test after it would fail ("cannot be called from a
# running event loop"). A chromium starts in under a second.
@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="session")
def _old_shots_cleared() -> None:
    shots.clear_old_shots()


@pytest.fixture(scope="module")
def browser(playwright: Playwright, _old_shots_cleared: None) -> Iterator[Browser]:
    """A headless chromium for the module. Without one, every browser test fails saying what to
    install: they are never skipped, or CI would pass without them."""
    if problem := missing():
        pytest.fail(problem, pytrace=False)
    chromium = launch(playwright)
    expect.set_options(timeout=ACTION_TIMEOUT_MS)
    yield chromium
    chromium.close()


@pytest.fixture
def page_problems() -> list[str]:
    """What went wrong in the test's page (CSP violations, uncaught errors). The page fixture fails
    the test if any is left at its end: a test that provokes one on purpose checks it and clears it."""
    return []


@pytest.fixture
def page(browser: Browser, page_problems: list[str], request: pytest.FixtureRequest) -> Iterator[Page]:
    """A page in a context of its own (cookies, storage), closed after the test; a screenshot
    ``FAILED-<test>`` if the test failed. The test fails too if the page broke its Content
    Security Policy or threw: either means part of the console silently did not run."""
    context = browser.new_context()
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    context.set_default_navigation_timeout(NAVIGATION_TIMEOUT_MS)
    p = context.new_page()
    p.on("pageerror", lambda error: page_problems.append(f"uncaught {error.name}: {error.message}"))
    p.on("console", lambda message: page_problems.extend(csp_violation(message)))
    yield p
    if request.node.stash.get(FAILED, False):
        shots.screenshot(p, f"FAILED-{request.node.nodeid}")
    url = p.url
    context.close()
    assert not page_problems, f"the page at {url} went wrong in the browser: {page_problems}"


def csp_violation(message: ConsoleMessage) -> list[str]:
    """Chromium reports what the Content Security Policy blocked (an inline script, say) on the console."""
    return [message.text] if "Content Security Policy" in message.text else []


@pytest.fixture
def operator_page(page: Page, console: Console) -> Page:
    """``page``, signed in to ``console`` with the operator's key and showing the overview."""
    sign_in(page, console)
    return page


@pytest.fixture(scope="module")
def console() -> Iterator[Console]:
    """The module's own processes with the console on (``stack.console_stack``)."""
    with console_stack() as c:
        yield c


@pytest.fixture(scope="module")
def attacker() -> Iterator[Attacker]:
    with attacker_site() as a:
        yield a
