"""The operator console in a real headless browser: Debian's chromium driven by Playwright,
against real processes (a private redis-server, ``python -m api`` with the console on, workers).

Fixtures (``conftest.py``): ``browser`` (a chromium per module), ``page`` (a fresh context per
test: no cookie leaks from one test to the next), ``console`` (the processes, per module:
``stack.Console``) and ``attacker`` (a page of another origin, ``attacker.Attacker``).
``shots.screenshot(page, name)`` writes a PNG to ``CARMY_SCREENSHOTS`` (default
``tests/browser/screenshots/``). Every test here is marked ``e2e`` and ``browser``.

Wait on conditions, never on time: Playwright's locators and ``expect`` wait by themselves (10 s by
default here, for a busy machine); a promise of the issue such as "within two seconds" is an
explicit ``timeout=2_000``.
"""
