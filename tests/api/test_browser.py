"""CARMY_ALLOWED_HOSTS and its default, through the in-process app (tests/e2e/test_browsers.py
has the rest, against a real server)."""

from __future__ import annotations

import pytest

from api.guards.browser import split_host
from api.settings import ApiSettings
from tests.api.test_embedded import host_app
from tests.conftest import app_client, asgi_client
from tests.support import Stack, app_settings

LISTED = ("api", "carmy.example:8443", "*.corp.example", "[::1]")


@pytest.mark.parametrize(("env", "expected"), [
    ({}, ("localhost", "127.0.0.1", "[::1]", "127.0.0.1")),  # bin/run: loopback only
    ({"CARMY_HOST": "::1"}, ("localhost", "127.0.0.1", "[::1]", "::1")),
    ({"CARMY_HOST": "127.0.0.2"}, ("localhost", "127.0.0.1", "[::1]", "127.0.0.2")),
    ({"CARMY_HOST": "0.0.0.0"}, ("*",)),  # reached by names it cannot know
    ({"CARMY_HOST": "0.0.0.0", "CARMY_ALLOWED_HOSTS": " api , localhost,"}, ("api", "localhost")),
    ({"CARMY_ALLOWED_HOSTS": "*"}, ("*",)),
])
def test_default_follows_the_address_bound(env: dict[str, str], expected: tuple[str, ...]) -> None:
    assert ApiSettings.from_env(env).hosts_allowed() == expected


@pytest.mark.parametrize(("host", "status"), [
    ("api", 200), ("api:8000", 200), ("API.", 200),  # a name without a port: any port
    ("carmy.example:8443", 200), ("carmy.example", 403), ("carmy.example:8000", 403),
    ("x.corp.example", 200), ("a.b.corp.example:1", 200), ("corp.example", 403),
    ("[::1]:8000", 200),
    ("localhost", 403),  # an explicit list replaces the loopback default
    ("api.evil.example", 403), ("evil-api", 403), ("api:x", 403), ("[::1", 403),
])
async def test_an_explicit_list(stack: Stack, host: str, status: int) -> None:
    async with app_client(app_settings(stack.redis_url, allowed_hosts=LISTED)) as client:
        r = await client.get("/agent/tools", headers={"host": host})
    assert r.status_code == status
    if status == 403:
        assert r.json()["error"]["code"] == "HOST_NOT_ALLOWED"


async def test_a_star_opts_out(stack: Stack) -> None:
    async with app_client(app_settings(stack.redis_url, host="0.0.0.0")) as client:
        r = await client.get("/agent/tools", headers={"host": "anything.example"})
    assert r.status_code == 200


async def test_same_origin_behind_a_tls_proxy(stack: Stack) -> None:
    # The proxy speaks http to the API; the page's origin is https with its default port.
    settings = app_settings(stack.redis_url, allowed_hosts=("carmy.example",))
    async with app_client(settings) as client:
        for origin, status in [("https://carmy.example", 200), ("http://carmy.example", 200),
                               ("https://carmy.example:8443", 403), ("https://other.example", 403)]:
            r = await client.get("/agent/tools", headers={"host": "carmy.example", "origin": origin})
            assert r.status_code == status, origin


async def test_a_mounted_app_checks_its_own_paths(stack: Stack) -> None:
    app = host_app(app_settings(stack.redis_url))
    async with asgi_client(app) as client:
        assert (await client.get("/carmy/health", headers={"host": "10.0.0.1"})).status_code == 200
        assert (await client.get("/carmy/agent/tools", headers={"host": "10.0.0.1"})).status_code == 403
        assert (await client.get("/carmy/agent/tools")).status_code == 200


def test_host_values_are_read_strictly() -> None:
    assert split_host("[::1]:8000") == ("::1", 8000)
    assert split_host("Example.COM.:80") == ("example.com", 80)
    assert split_host("a:b") is None
    assert split_host("[::1]x") is None
    assert split_host("") is None
    # Digits to str.isdigit() that int() refuses ("²") or reads ("١"): not a port.
    assert split_host("a:\u00b2") is None
    assert split_host("[::1]:\u0661") is None


async def test_a_host_whose_port_is_no_ascii_number_is_refused_not_a_fault(stack: Stack) -> None:
    # A Host is read as Latin-1: b"\xb2" is "²", a digit to str.isdigit() and none to int().
    async with app_client(app_settings(stack.redis_url)) as client:
        r = await client.get("/agent/tools", headers={"host": b"localhost:\xb2"})
    assert (r.status_code, r.json()["error"]["code"]) == (403, "HOST_NOT_ALLOWED")



@pytest.mark.parametrize(("content_type", "reason"), [
    (None, "no Content-Type"),
    ("", "an empty Content-Type"),
    ("  ", "an empty Content-Type"),
    ("application/+json", "Content-Type application/+json"),  # a suffix needs a subtype before it
    ("text/plain", "Content-Type text/plain"),
])
async def test_a_body_not_declared_json_is_refused_saying_what_was_sent(
        stack: Stack, content_type: str | None, reason: str) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    async with app_client(app_settings(stack.redis_url)) as client:
        r = await client.post("/agent/execute", content=b'{"tool": "noop"}', headers=headers)
    assert r.status_code == 415
    assert r.json()["error"]["details"]["reason"] == reason


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8",
                                          "application/vnd.carmy+json", "application/problem+json"])
async def test_json_and_its_suffixed_types_pass(stack: Stack, content_type: str) -> None:
    async with app_client(app_settings(stack.redis_url)) as client:
        r = await client.post("/agent/execute", content=b'{"tool": 1}', headers={"content-type": content_type})
    assert r.status_code == 400  # read, and refused for what it says
