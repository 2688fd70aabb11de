"""The console with Carmy mounted in a host app at ``/carmy`` (README, "Embedding"): every link,
form, script and redirect it hands out, and its cookie's path, carry the mount's prefix
(``root_path``), as the agent API's URLs do. Against the app in process, a real Redis and a
real worker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from html.parser import HTMLParser

import httpx
import pytest
from starlette.applications import Starlette

from api.settings import ApiSettings
from tests.api.test_console import csrf_of
from tests.api.test_console_pages import AGENT_KEY, OPERATOR_KEY, ORIGIN, PAGE, console_settings
from tests.api.test_embedded import host_app
from tests.support import Proc, Stack

PREFIX = "/carmy/console"


@pytest.fixture(scope="module")
def api_settings(stack: Stack) -> ApiSettings:
    return console_settings(stack.redis_url)


@pytest.fixture(scope="module")
def asgi_app(api_settings: ApiSettings) -> Starlette:
    return host_app(api_settings)


@pytest.fixture
async def operator(worker: Proc, client: httpx.AsyncClient, asgi_app: object) -> AsyncIterator[httpx.AsyncClient]:
    """Signed in through the mount, by the form's own action."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi_app),  # type: ignore[arg-type]
                                 base_url="http://localhost") as c:
        form = await c.get(PREFIX + "/sign-in", headers=PAGE)
        assert form.status_code == 200
        assert f'action="{PREFIX}/sign-in"' in form.text
        signed = await c.post(PREFIX + "/sign-in", data={"csrf": csrf_of(form.text), "token": OPERATOR_KEY},
                              headers=ORIGIN)
        assert signed.status_code == 303
        assert signed.headers["location"] == PREFIX
        assert f"; Path={PREFIX}; " in signed.headers["set-cookie"]
        yield c


class Links(HTMLParser):
    """Every URL a page hands out: links, forms, scripts, stylesheets, its live sources."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("href", "src", "action", "data-live") and value]


def links(page: str) -> list[str]:
    parsed = Links()
    parsed.feed(page)
    return [url for url in parsed.urls if url.startswith("/")]


async def test_every_url_a_page_hands_out_is_under_the_mount(client: httpx.AsyncClient,
                                                               operator: httpx.AsyncClient) -> None:
    later = await client.post("/carmy/agent/jobs", json={"tool": "noop", "arguments": {}, "delay_ms": 600_000},
                              headers={"authorization": f"Bearer {AGENT_KEY}"})
    assert later.status_code == 202, later.text
    job = later.json()["job_id"]
    seen: set[str] = set()
    for path in ("", "/executions", "/jobs", "/jobs?status=scheduled", f"/jobs/{job}", f"/jobs/{job}/cancel",
                 "/tools", "/nope"):
        page = await operator.get(PREFIX + path, headers=PAGE)
        assert page.status_code == (404 if path == "/nope" else 200), path
        found = links(page.text)
        assert found and all(url.startswith(PREFIX) for url in found), (path, found)
        seen.update(url.split("#")[0] for url in found)
        if path in ("/jobs", "/tools"):
            assert f'href="{PREFIX}{path}" aria-current="page"' in page.text
    assert f"{PREFIX}/jobs/{job}" in seen and f"{PREFIX}/live" in seen and f"{PREFIX}/sign-out" in seen
    # Each reached through the mount (the forms' actions are POSTed below; /live is a stream that
    # ASGITransport would read to its end, 10 s on).
    for url in sorted(u for u in seen if not u.endswith(("/sign-out", "/cancel", "/live"))):
        answer = await operator.get(url, headers=PAGE)
        assert answer.status_code == 200, url


async def test_a_button_and_signing_out_come_back_under_the_mount(client: httpx.AsyncClient,
                                                                  operator: httpx.AsyncClient) -> None:
    later = await client.post("/carmy/agent/jobs", json={"tool": "noop", "arguments": {}, "delay_ms": 600_000},
                              headers={"authorization": f"Bearer {AGENT_KEY}"})
    job = later.json()["job_id"]
    confirm = await operator.get(f"{PREFIX}/jobs/{job}/cancel", headers=PAGE)
    done = await operator.post(f"{PREFIX}/jobs/{job}/cancel", data={"csrf": csrf_of(confirm.text)}, headers=ORIGIN)
    assert done.status_code == 303
    assert done.headers["location"] == f"{PREFIX}/jobs/{job}?done=cancelled"
    # Another site's form, to the same button: refused on a page of the console under the mount.
    refused = await operator.post(f"{PREFIX}/jobs/{job}/retry", data={"csrf": csrf_of(confirm.text)},
                                  headers={"origin": "https://evil.example"})
    assert refused.status_code == 403
    assert links(refused.text) and all(url.startswith(PREFIX) for url in links(refused.text))
    out = await operator.post(PREFIX + "/sign-out", data={"csrf": csrf_of(confirm.text)}, headers=ORIGIN)
    assert out.status_code == 303
    assert out.headers["location"] == PREFIX + "/sign-in"
    assert f"; Path={PREFIX}; Max-Age=0;" in out.headers["set-cookie"]
    assert (await operator.get(PREFIX, headers=PAGE)).headers["location"] == PREFIX + "/sign-in"


async def test_without_a_session_the_way_to_sign_in_is_under_the_mount(client: httpx.AsyncClient) -> None:
    page = await client.get(PREFIX + "/jobs", headers=PAGE)
    assert page.status_code == 303
    assert page.headers["location"] == PREFIX + "/sign-in"
    script = await client.get(PREFIX + "/jobs", headers={"accept": "application/json"})
    assert script.status_code == 401
    assert script.json()["error"]["message"] == f"Sign in at {PREFIX}/sign-in."
    # The host's own paths are not the console's, however they are spelt.
    assert (await client.get("/console", headers=PAGE)).status_code == 404
