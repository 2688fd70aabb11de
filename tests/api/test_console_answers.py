"""Every answer under ``/console`` is one of the console's pages with the console's headers
(``api/console/entrance.py``): an unknown path, an unknown or malformed id, a method not allowed,
a fault in a page or in the guard, Redis out of reach, a foreign Host or Origin. Never
Starlette's bare text, never the API's JSON, never a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
import pytest

from api.app import create_app
from api.calling.jobs import Jobs
from api.console.session import Signer
from api.settings import ApiSettings
from tests.api.test_console import CSP, InlineFinder, sign_in
from tests.api.test_console_pages import OPERATOR_KEY, PAGE, UNKNOWN_EXEC, UNKNOWN_JOB, console_settings
from tests.conftest import asgi_client
from tests.support import Proc, Stack, app_settings

NO_REDIS = "redis://127.0.0.1:1/0"


@pytest.fixture(scope="module")
def api_settings(stack: Stack) -> ApiSettings:
    return console_settings(stack.redis_url)


@pytest.fixture
async def operator(worker: Proc, client: httpx.AsyncClient, asgi_app: object) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi_app),  # type: ignore[arg-type]
                                 base_url="http://localhost") as c:
        assert (await sign_in(c, OPERATOR_KEY)).status_code == 303
        yield c


def assert_console_page(answer: httpx.Response, status: int) -> None:
    """``answer`` is a console page: its status, the console's headers, HTML with no inline code and
    no trace of Python."""
    assert answer.status_code == status, (answer.request.method, answer.request.url, answer.text[:300])
    headers = answer.headers
    assert headers["content-security-policy"] == CSP
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "same-origin"
    assert headers["cross-origin-opener-policy"] == "same-origin"
    assert headers["cache-control"] == "no-store"
    assert headers["content-type"] == "text/html; charset=utf-8"
    assert answer.text.startswith("<!doctype html>")
    assert "Traceback" not in answer.text and "File \"" not in answer.text
    finder = InlineFinder()
    finder.feed(answer.text)
    assert finder.found == []


@pytest.mark.parametrize(("path", "says"), [
    ("/console/nope", "No such page"),
    ("/console/jobs/job_nope/more/than/a/route", "No such page"),
    ("/console/static/nope.css", "No such page"),
    ("/console/static/../session.py", "No such page"),
    (f"/console/jobs/{UNKNOWN_JOB}", "No such job"),
    ("/console/jobs/not-a-job-id", "No such job"),
    (f"/console/jobs/{UNKNOWN_JOB}/retry", "No such job"),
    (f"/console/executions/{UNKNOWN_EXEC}", "No such execution"),
    ("/console/executions/exec_nope", "not an execution id"),
])
async def test_an_unknown_page_or_id_is_a_404_page(operator: httpx.AsyncClient, path: str, says: str) -> None:
    answer = await operator.get(path, headers=PAGE)
    assert_console_page(answer, 404)
    assert says in answer.text
    assert "Signed in as" in answer.text or says == "No such page"


async def test_an_unknown_path_is_a_404_page_without_a_session_too(client: httpx.AsyncClient) -> None:
    """Nothing to protect: the console's routes are no secret, and a sign-in form there would only
    send the person back to a page that does not exist."""
    answer = await client.get("/console/nope", headers=PAGE)
    assert_console_page(answer, 404)
    assert "set-cookie" not in answer.headers


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("DELETE", "/console/jobs", "GET, HEAD"),
    ("POST", "/console/tools", "GET, HEAD"),
    ("PUT", "/console", "GET, HEAD"),
    ("GET", "/console/sign-out", "POST"),
    ("POST", "/console/static/console.css", "GET, HEAD"),
    # Two routes at one path: Allow names both (Starlette's names the first one's only).
    ("PUT", f"/console/jobs/{UNKNOWN_JOB}/retry", "GET, HEAD, POST"),
])
async def test_a_method_not_allowed_is_a_405_page(operator: httpx.AsyncClient, method: str, path: str,
                                                  allow: str) -> None:
    answer = await operator.request(method, path, headers=PAGE)
    assert_console_page(answer, 405)
    assert answer.headers["allow"] == allow
    assert f"does not take {method}" in answer.text


async def test_a_trailing_slash_is_redirected_with_the_consoles_headers(operator: httpx.AsyncClient) -> None:
    answer = await operator.get("/console/jobs/", headers=PAGE)
    assert answer.status_code == 307
    assert answer.headers["location"] == "http://localhost/console/jobs"
    assert answer.headers["content-security-policy"] == CSP


async def test_a_fault_in_a_page_is_a_500_page_and_its_traceback_is_logged(
        operator: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("internal-detail-7c1e: never on the page")

    monkeypatch.setattr(Jobs, "page", broken)
    with caplog.at_level(logging.ERROR, logger="carmy.api"):
        answer = await operator.get("/console/jobs", headers=PAGE)
    assert_console_page(answer, 500)
    assert "Something went wrong" in answer.text
    assert "internal-detail-7c1e" not in answer.text
    assert "Signed in as <strong>olga</strong>" in answer.text  # the nav, to go elsewhere
    [logged] = [r for r in caplog.records if "GET '/console/jobs' failed" in r.getMessage()]
    assert logged.exc_info is not None and "internal-detail-7c1e" in str(logged.exc_info[1])
    monkeypatch.undo()
    assert (await operator.get("/console/jobs", headers=PAGE)).status_code == 200


async def test_a_fault_in_the_guard_is_a_500_page(operator: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Signer, value: str | None) -> None:
        raise ValueError("internal-detail-51ab")

    monkeypatch.setattr(Signer, "open", broken)
    for method, path in (("GET", "/console"), ("POST", "/console/sign-out")):
        answer = await operator.request(method, path, headers={**PAGE, "origin": "http://localhost"})
        assert_console_page(answer, 500)
        assert "internal-detail-51ab" not in answer.text


@pytest.mark.slow
async def test_redis_out_of_reach_is_a_503_page() -> None:
    # No console secret: the guard needs Redis for the shared one before any page.
    async with asgi_client(create_app(app_settings(NO_REDIS, console=True))) as c:
        for path in ("/console", "/console/jobs"):
            answer = await c.get(path, headers=PAGE)
            assert_console_page(answer, 503)
            assert "cannot reach Redis" in answer.text
        assert_console_page(await c.get("/console/nope", headers=PAGE), 404)  # no Redis needed to say so
    # A secret configured: the page itself cannot read.
    async with asgi_client(create_app(app_settings(NO_REDIS, console=True, console_secret="s" * 40))) as c:
        for path in ("/console/jobs", f"/console/executions/{UNKNOWN_EXEC}"):
            assert_console_page(await c.get(path, headers=PAGE), 503)


@pytest.mark.parametrize(("method", "headers", "says"), [
    ("GET", {"host": "rebound.example"}, "not in CARMY_ALLOWED_HOSTS"),
    ("POST", {"origin": "https://evil.example"}, "Requests from &#39;https://evil.example&#39; are not allowed"),
    ("GET", {"origin": "https://evil.example"}, "are not allowed"),
])
async def test_a_foreign_host_or_origin_is_a_403_page(operator: httpx.AsyncClient, method: str,
                                                      headers: dict[str, str], says: str) -> None:
    """Refused by BrowserGuard before any route: a page too, where /agent/* gets the JSON envelope."""
    answer = await operator.request(method, "/console/sign-out" if method == "POST" else "/console/jobs",
                                    headers={**PAGE, **headers})
    assert_console_page(answer, 403)
    assert says in answer.text
    agent = await operator.request(method, "/agent/jobs", headers=headers)
    assert agent.status_code == 403
    assert agent.json()["error"]["code"] in ("HOST_NOT_ALLOWED", "ORIGIN_NOT_ALLOWED")


async def test_outside_the_console_starlettes_answers_are_kept(client: httpx.AsyncClient) -> None:
    for path in ("/consolex", "/agent/nope"):
        answer = await client.get(path, headers=PAGE)
        assert answer.status_code == 404
        assert "content-security-policy" not in answer.headers
