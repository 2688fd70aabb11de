"""The operator console (``api/console``): its sign-in, session cookie, CSRF and Origin checks,
its headers, and the Tools page, against the app in process, a real Redis and a real worker.

The module's app authenticates with API keys; the console off and the console open (no
authentication) are apps of their own, built in their tests.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from html.parser import HTMLParser
from types import SimpleNamespace
from typing import cast

import httpx
import pytest
from redis.asyncio import Redis

from api.app import create_app
from api.calling.catalog import Catalog, CatalogView, build_view
from api.console import session as console_session
from api.console.pages.tools import ToolsPage
from api.console.render import environment
from api.console.session import COOKIE, SECURE_COOKIE, Session, Sessions, Signer
from api.guards.oauth import OAuthSettings
from api.settings import ApiKey, ApiSettings
from carmy_worker.store import keys
from carmy_worker.wire import ToolSpec, WorkerInfo, WorkerTool
from tests.conftest import asgi_client
from tests.issuer import ISSUER, RESOURCE, issuing, new_key
from tests.support import Stack, app_settings

OPERATOR_KEY = "operator-key-0123456789"
AGENT_KEY = "agent-key-0123456789abc"
SECRET = "s" * 40
ORIGIN = {"origin": "http://localhost"}  # the ASGI client's own (its Host is localhost)
HTTPS_ORIGIN = {"origin": "https://localhost"}
PAGE = {"accept": "text/html,application/xhtml+xml"}  # what a browser's navigation asks for
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


@pytest.fixture(scope="module")
def api_settings(stack: Stack) -> ApiSettings:
    return app_settings(stack.redis_url, console=True, console_secret=SECRET, api_keys={
        OPERATOR_KEY: ApiKey(principal="olga", permissions=frozenset({"carmy:operator"})),
        AGENT_KEY: ApiKey(principal="agent"),
    })


def csrf_of(page: str) -> str:
    """The CSRF token of a page's forms, or of its ``csrf-token`` meta (for its scripts' POSTs)."""
    found = re.search(r'name="csrf" value="([^"]+)"', page) or re.search(r'name="csrf-token" content="([^"]+)"', page)
    assert found, "the page has no CSRF token"
    return found.group(1)


async def sign_in(client: httpx.AsyncClient, token: str, *, headers: dict[str, str] | None = None) -> httpx.Response:
    """The sign-in form fetched, then posted with ``token`` as a browser on this console would."""
    form = await client.get("/console/sign-in", headers=PAGE)
    assert form.status_code == 200
    return await client.post("/console/sign-in", data={"csrf": csrf_of(form.text), "token": token},
                             headers=ORIGIN if headers is None else headers)


@pytest.fixture
async def operator(client: httpx.AsyncClient, asgi_app: object) -> AsyncIterator[httpx.AsyncClient]:
    """A client of its own (its own cookies), signed in as the operator (``client`` keeps the
    module's app running: its catalog, for one, which a test run alone found empty)."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi_app),  # type: ignore[arg-type]
                                 base_url="http://localhost") as c:
        signed = await sign_in(c, OPERATOR_KEY)
        assert signed.status_code == 303, signed.text
        yield c


@pytest.fixture
async def browser(client: httpx.AsyncClient, asgi_app: object) -> AsyncIterator[httpx.AsyncClient]:
    """A fresh client, no cookie (``client`` keeps the module's app running)."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi_app),  # type: ignore[arg-type]
                                 base_url="http://localhost") as c:
        yield c


def set_cookie(response: httpx.Response) -> str:
    cookies = [v for k, v in response.headers.multi_items() if k == "set-cookie" and v.startswith(COOKIE + "=")]
    assert len(cookies) == 1, response.headers
    return cookies[0]


# -- off -------------------------------------------------------------------------------------

async def test_the_console_off_has_no_route(stack: Stack) -> None:
    async with asgi_client(create_app(app_settings(stack.redis_url))) as c:
        for path in ("/console", "/console/sign-in", "/console/tools", "/console/static/console.css"):
            assert (await c.get(path, headers=PAGE)).status_code == 404, path
        assert (await c.post("/console/sign-in", headers=ORIGIN)).status_code in (404, 405)


# -- sign-in ---------------------------------------------------------------------------------

async def test_an_operator_signs_in_and_gets_a_strict_cookie(browser: httpx.AsyncClient) -> None:
    signed = await sign_in(browser, OPERATOR_KEY)
    assert signed.status_code == 303
    assert signed.headers["location"] == "/console"
    cookie = set_cookie(signed)
    attributes = {a.strip().split("=")[0].lower(): a for a in cookie.split(";")[1:]}
    assert "httponly" in attributes
    assert attributes["samesite"].strip() == "SameSite=Strict"
    assert attributes["path"].strip() == "Path=/console"
    assert attributes["max-age"].strip() == "Max-Age=3600"
    assert "secure" not in attributes  # plain HTTP, and CARMY_CONSOLE_SECURE_COOKIES is off
    assert OPERATOR_KEY not in cookie
    for path in ("/console", "/console/tools"):
        page = await browser.get(path, headers=PAGE)
        assert page.status_code == 200, path
        assert page.headers["content-security-policy"] == CSP
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["cache-control"] == "no-store"
        assert page.headers["referrer-policy"] == "same-origin"
        assert "Signed in as <strong>olga</strong>" in page.text


def host_cookie(response: httpx.Response) -> str:
    cookies = [v for k, v in response.headers.multi_items() if k == "set-cookie"]
    assert len(cookies) == 1 and cookies[0].startswith(SECURE_COOKIE + "="), response.headers
    return cookies[0]


@pytest.fixture
async def https_operator(client: httpx.AsyncClient, asgi_app: object) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the console over HTTPS, signed in as the operator."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi_app),  # type: ignore[arg-type]
                                 base_url="https://localhost") as c:
        signed = await sign_in(c, OPERATOR_KEY, headers=HTTPS_ORIGIN)
        assert signed.status_code == 303
        assert host_cookie(signed) == f"{SECURE_COOKIE}={c.cookies[SECURE_COOKIE]}; Path=/; Max-Age=3600; HttpOnly; " \
                                      "SameSite=Strict; Secure"
        yield c


async def test_over_https_the_cookie_is_a_host_cookie(https_operator: httpx.AsyncClient) -> None:
    """__Host-: Secure, Path=/ and no Domain, or a browser refuses it; and no page of another port
    over plain HTTP, nor of a sibling subdomain, can set one that shadows it."""
    assert COOKIE not in https_operator.cookies
    page = await https_operator.get("/console", headers=PAGE)
    assert "Signed in as <strong>olga</strong>" in page.text
    out = await https_operator.post("/console/sign-out", data={"csrf": csrf_of(page.text)}, headers=HTTPS_ORIGIN)
    assert out.status_code == 303
    assert host_cookie(out) == f"{SECURE_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict; Secure"


async def test_behind_a_proxy_that_ends_tls_the_cookie_is_a_host_cookie(stack: Stack) -> None:
    settings = app_settings(stack.redis_url, console=True, console_secret=SECRET, console_secure_cookies=True)
    async with asgi_client(create_app(settings)) as c:
        page = await c.get("/console", headers=PAGE)  # open: an anonymous session, over plain HTTP
        cookie = host_cookie(page)
        assert cookie.endswith("; Path=/; Max-Age=3600; HttpOnly; SameSite=Strict; Secure")
        # The browser sends it back (it sees https); httpx's jar would not, over http.
        c.cookies.clear()
        sent = {**ORIGIN, "cookie": cookie.split(";")[0]}
        assert (await c.post("/console/sign-out", data={"csrf": csrf_of(page.text)}, headers=sent)).status_code == 303


async def test_over_https_a_tossed_plain_cookie_is_not_read(https_operator: httpx.AsyncClient) -> None:
    """A page of the same site (another port over HTTP, a sibling subdomain) may set ``carmy_console``
    with a longer Path, which the browser sends first: over HTTPS the console reads only the
    ``__Host-`` cookie, so a tossed one neither signs the operator out nor in as someone else."""
    mallory = forged(Session(sid="m", principal="mallory", signed_in=True, expires=2**40))
    for path in ("/console/tools", "/console"):
        https_operator.cookies.set(COOKIE, mallory, domain="localhost.local", path=path)
        page = await https_operator.get("/console/tools", headers=PAGE)
        assert "Signed in as <strong>olga</strong>" in page.text
    https_operator.cookies.delete(SECURE_COOKIE)
    assert (await https_operator.get("/console/tools", headers=PAGE)).status_code == 303  # not mallory's


async def test_over_plain_http_a_host_cookie_is_not_read(browser: httpx.AsyncClient) -> None:
    """Each scheme reads its one name: a ``__Host-`` cookie is no session over plain HTTP (the
    setting that would make it one is off)."""
    browser.cookies.set(SECURE_COOKIE, forged(Session(sid="x", principal="olga", signed_in=True, expires=2**40)),
                        domain="localhost.local", path="/")
    assert (await browser.get("/console", headers=PAGE)).status_code == 303


async def test_a_key_without_the_operator_permission_is_refused(browser: httpx.AsyncClient) -> None:
    refused = await sign_in(browser, AGENT_KEY)
    assert refused.status_code == 403
    assert "lacks the operator permission (carmy:operator)" in refused.text
    assert (await browser.get("/console", headers=PAGE)).status_code == 303


@pytest.mark.parametrize("token", ["not-a-key-at-all-0123", OPERATOR_KEY[:-1] + "x", "eyJh.eyJi.c2ln", ""])
async def test_a_wrong_token_gets_one_message_whatever_was_wrong(browser: httpx.AsyncClient, token: str) -> None:
    refused = await sign_in(browser, token)
    assert refused.status_code == 401
    assert "This is not a valid API key or access token." in refused.text
    assert (await browser.get("/console", headers=PAGE)).status_code == 303


async def test_signing_out_ends_the_session(operator: httpx.AsyncClient) -> None:
    page = await operator.get("/console", headers=PAGE)
    out = await operator.post("/console/sign-out", data={"csrf": csrf_of(page.text)}, headers=ORIGIN)
    assert out.status_code == 303
    assert out.headers["location"] == "/console/sign-in"
    assert "Max-Age=0" in set_cookie(out)
    assert (await operator.get("/console", headers=PAGE)).status_code == 303


# -- without a session -------------------------------------------------------------------------

async def test_a_browser_without_a_session_is_sent_to_sign_in(browser: httpx.AsyncClient) -> None:
    for path in ("/console", "/console/tools"):
        answer = await browser.get(path, headers=PAGE)
        assert answer.status_code == 303
        assert answer.headers["location"] == "/console/sign-in"
        assert answer.headers["content-security-policy"] == CSP


@pytest.mark.parametrize("accept", ["application/json", "text/event-stream", "*/*"])
async def test_a_script_without_a_session_gets_401(browser: httpx.AsyncClient, accept: str) -> None:
    answer = await browser.get("/console", headers={"accept": accept})
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "UNAUTHENTICATED"


def put_cookie(client: httpx.AsyncClient, value: str) -> None:
    """``value`` as the session cookie, in place of any the client holds."""
    client.cookies.clear()
    # http.cookiejar keeps a dotless host's cookies under "<host>.local".
    client.cookies.set(COOKIE, value, domain="localhost.local", path="/console")


def forged(session: Session, secret: str = SECRET) -> str:
    return Signer(secret.encode()).seal(session)


@pytest.mark.parametrize("cookie", [
    # signed with another secret
    forged(Session(sid="x", principal="olga", signed_in=True, expires=2**40), "t" * 40),
    # expired
    forged(Session(sid="x", principal="olga", signed_in=True, expires=1)),
    # an anonymous session (the sign-in form's) is not signed in
    forged(Session(sid="x", principal=None, signed_in=False, expires=2**40)),
    "garbage", "a.b", "",
], ids=["foreign", "expired", "anonymous", "garbage", "dotted", "empty"])
async def test_a_cookie_that_is_not_a_valid_session_is_refused(browser: httpx.AsyncClient, cookie: str) -> None:
    put_cookie(browser, cookie)
    answer = await browser.get("/console/tools", headers=PAGE)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/console/sign-in"


async def test_a_tampered_cookie_is_refused(operator: httpx.AsyncClient) -> None:
    value = operator.cookies[COOKIE]
    payload, mac = value.split(".")
    # Another principal under the same signature.
    other = Signer(b"irrelevant").seal(Session(sid="x", principal="mallory", signed_in=True, expires=2**40))
    put_cookie(operator, other.split(".")[0] + "." + mac)
    assert (await operator.get("/console", headers=PAGE)).status_code == 303
    put_cookie(operator, payload[:-2] + ("AA" if payload[-2:] != "AA" else "BB") + "." + mac)
    assert (await operator.get("/console", headers=PAGE)).status_code == 303
    put_cookie(operator, value)
    assert (await operator.get("/console", headers=PAGE)).status_code == 200


async def test_a_session_longer_than_the_configured_lifetime_is_refused(browser: httpx.AsyncClient) -> None:
    """CARMY_CONSOLE_SESSION lowered (from a week to the hour this app has, say) and the API restarted:
    a session signed in under the old setting ends now, not a week later."""
    signer = Signer(SECRET.encode())
    put_cookie(browser, signer.seal(signer.new(principal="olga", signed_in=True, lifetime=7 * 86400)))
    assert (await browser.get("/console", headers=PAGE)).status_code == 303
    put_cookie(browser, signer.seal(signer.new(principal="olga", signed_in=True, lifetime=3600)))
    assert (await browser.get("/console", headers=PAGE)).status_code == 200


# -- POSTs: Origin and CSRF ----------------------------------------------------------------------

async def test_a_post_without_its_csrf_token_is_refused(operator: httpx.AsyncClient) -> None:
    for form in ({}, {"csrf": ""}, {"csrf": "not-the-token"}):
        refused = await operator.post("/console/sign-out", data=form, headers=ORIGIN)
        assert refused.status_code == 403
        assert refused.headers["content-security-policy"] == CSP
        assert (await operator.get("/console", headers=PAGE)).status_code == 200  # still signed in


async def test_another_sessions_csrf_token_is_refused(operator: httpx.AsyncClient, browser: httpx.AsyncClient) -> None:
    theirs = csrf_of((await browser.get("/console/sign-in", headers=PAGE)).text)
    refused = await operator.post("/console/sign-out", data={"csrf": theirs}, headers=ORIGIN)
    assert refused.status_code == 403


@pytest.mark.parametrize("origin", ["https://evil.example", "http://localhost:8080", "null"])
async def test_a_cross_site_form_post_is_refused_and_changes_nothing(operator: httpx.AsyncClient, origin: str) -> None:
    page = await operator.get("/console", headers=PAGE)
    refused = await operator.post("/console/sign-out", data={"csrf": csrf_of(page.text)}, headers={"origin": origin})
    assert refused.status_code == 403
    assert "set-cookie" not in refused.headers
    assert (await operator.get("/console", headers=PAGE)).status_code == 200


async def test_a_cross_site_sign_in_is_refused(browser: httpx.AsyncClient) -> None:
    refused = await sign_in(browser, OPERATOR_KEY, headers={"origin": "https://evil.example"})
    assert refused.status_code == 403
    assert COOKIE + "=" not in refused.headers.get("set-cookie", "")
    assert (await browser.get("/console", headers=PAGE)).status_code == 303


async def test_a_post_without_origin_is_refused(operator: httpx.AsyncClient) -> None:
    page = await operator.get("/console", headers=PAGE)
    refused = await operator.post("/console/sign-out", data={"csrf": csrf_of(page.text)})
    assert refused.status_code == 403
    assert "not sent from this console" in refused.text
    assert (await operator.get("/console", headers=PAGE)).status_code == 200


async def test_a_post_that_is_not_a_form_is_refused(operator: httpx.AsyncClient) -> None:
    page = await operator.get("/console", headers=PAGE)
    refused = await operator.post("/console/sign-out", json={"csrf": csrf_of(page.text)}, headers=ORIGIN)
    assert refused.status_code == 415


async def test_a_foreign_host_is_refused_as_on_agent_routes(operator: httpx.AsyncClient) -> None:
    refused = await operator.get("/console", headers={**PAGE, "host": "rebound.example"})
    assert refused.status_code == 403
    assert "it is not in CARMY_ALLOWED_HOSTS" in refused.text  # on a page (test_console_answers.py)
    assert "Signed in as" not in refused.text


# -- the Tools page ------------------------------------------------------------------------------

async def test_the_tools_page_shows_badges_and_who_serves(operator: httpx.AsyncClient, stack: Stack) -> None:
    async with Redis.from_url(stack.redis_url) as redis:
        workers = [w.decode() for w in await redis.zrange(keys.workers(0), 0, -1)]
    page = (await operator.get("/console/tools", headers=PAGE)).text
    publish = page[page.index('id="tool-publish"'):]
    publish = publish[:publish.index("</article>")]
    assert "confirmation required" in publish
    assert "not idempotent" in publish
    assert "write" in publish
    wipe = page[page.index('id="tool-wipe"'):]
    assert "destructive" in wipe[:wipe.index("</article>")]
    assert "<summary>Input schema</summary>" in publish
    assert any(worker in publish for worker in workers)
    assert all(worker in page for worker in workers)
    assert "serving" in page


def big_view() -> CatalogView:
    """1,000 tools served by 100 workers in 4 groups, one in 7 of them gone."""
    props = {f"field{i}": {"type": "string", "description": "x" * 40} for i in range(8)}
    schema = {"type": "object", "properties": props, "required": ["field0"], "additionalProperties": False}
    tools = [WorkerTool(spec=ToolSpec(name=f"tool_{i:04d}", description=f"Does thing {i}.", input_schema=schema,
                                      output_schema=schema, effect="read", idempotent=True, parallel_safe=True,
                                      confirmation="none"), timeout=30) for i in range(1000)]
    workers = [(WorkerInfo(worker_id=f"w{j:03d}", started_ms=1_700_000_000_000 + j, tools=tools,
                           group=f"{j % 4:064d}", host=f"host{j % 10}", pid=1000 + j), j % 7 != 0)
               for j in range(100)]
    return build_view("carmy", workers, {})


def test_the_tools_page_stays_fast_with_1000_tools_on_100_workers() -> None:
    catalog = SimpleNamespace(view=big_view())
    page = ToolsPage(cast(Catalog, catalog))
    started = time.perf_counter()
    model, listing = page.current()
    built = time.perf_counter() - started
    assert (len(model.tools), model.workers, model.live) == (1000, 100, 85)
    assert page.current()[1] is listing  # the same view: nothing built again
    started = time.perf_counter()
    html = render_page("tools.html", model=model, listing=listing)
    rendered = time.perf_counter() - started
    # About 0.4 s and 25 ms on an idle machine; the bounds leave room for a loaded one, and still
    # fail a page that renders every worker for every tool (100,000 rows).
    assert built < 10.0 and rendered < 1.0, (built, rendered)
    assert html.count('<article class="tool"') == 1000
    assert html.count("<tr>") == 100 + 4  # each worker once (and each group's header row), not once per tool
    catalog.view = big_view()
    assert page.current()[1] is not listing  # a new view: built again


def render_page(template: str, **context: object) -> str:
    return environment.get_template(template).render(visitor=None, csrf="", csrf_field=lambda: "", nav=[],
                                                     home="/console", **context)


# -- open: no authentication -----------------------------------------------------------------------

async def test_without_authentication_the_console_is_open_but_posts_still_need_csrf(stack: Stack) -> None:
    # With the API's own security headers on too: the console's policy is the one that holds.
    async with asgi_client(create_app(app_settings(stack.redis_url, console=True, security_headers=True))) as c:
        page = await c.get("/console", headers=PAGE)
        assert page.status_code == 200
        assert page.headers["content-security-policy"] == CSP
        assert page.headers["referrer-policy"] == "same-origin"
        assert "open, no sign-in" in page.text
        assert "HttpOnly" in set_cookie(page)  # an anonymous session, for the CSRF token
        assert (await c.get("/console/tools", headers=PAGE)).status_code == 200
        assert (await c.get("/console/sign-in", headers=PAGE)).status_code == 303
        assert (await c.post("/console/sign-out", data={}, headers=ORIGIN)).status_code == 403
        assert (await c.post("/console/sign-out", data={"csrf": csrf_of(page.text)},
                             headers={"origin": "https://evil.example"})).status_code == 403
        assert (await c.post("/console/sign-out", data={"csrf": csrf_of(page.text)}, headers=ORIGIN)).status_code == 303


async def test_an_access_token_with_the_operator_scope_signs_in_too(stack: Stack) -> None:
    with issuing(new_key("rsa-1")) as issuer:
        oauth = OAuthSettings(issuer=ISSUER, resource=RESOURCE, jwks_url=issuer.jwks_url)
        async with asgi_client(create_app(app_settings(stack.redis_url, console=True, oauth=oauth))) as c:
            assert (await sign_in(c, issuer.token(scope="tools:read"))).status_code == 403
            assert (await sign_in(c, issuer.token(exp=int(time.time()) - 600))).status_code == 401
            assert (await sign_in(c, issuer.token(aud="https://elsewhere.example"))).status_code == 401
            assert (await c.get("/console", headers=PAGE)).status_code == 303
            signed = await sign_in(c, issuer.token(sub="oona", scope="carmy:operator tools:read"))
            assert signed.status_code == 303
            assert "Signed in as <strong>oona</strong>" in (await c.get("/console", headers=PAGE)).text


async def test_replicas_share_the_secret_through_redis(stack: Stack) -> None:
    operator_key = ApiKey(principal="olga", permissions=frozenset({"carmy:operator"}))
    settings = app_settings(stack.redis_url, console=True, api_keys={OPERATOR_KEY: operator_key})
    async with asgi_client(create_app(settings)) as one, asgi_client(create_app(settings)) as two:
        assert (await sign_in(one, OPERATOR_KEY)).status_code == 303
        put_cookie(two, one.cookies[COOKIE])
        assert (await two.get("/console", headers=PAGE)).status_code == 200


async def test_replicas_agree_again_after_redis_loses_the_secret(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console_session, "SECRET_RECHECK_S", 0.0)  # every use asks Redis again
    settings = app_settings(stack.redis_url, console=True)
    async with Redis.from_url(stack.redis_url) as redis:
        old = Sessions(settings, redis)
        await old.signer()
        await redis.delete(keys.CONSOLE_SECRET)  # as a Redis restarted without its files
        new = Sessions(settings, redis)  # a replica started since writes a secret of its own
        session = (await new.signer()).new(principal="olga", signed_in=True, lifetime=60)
        sealed = (await new.signer()).seal(session)
        assert (await old.signer()).open(sealed) == session  # the older replica takes it up


# -- static files ----------------------------------------------------------------------------------

async def test_static_files_are_versioned_and_cached_long(browser: httpx.AsyncClient) -> None:
    page = (await browser.get("/console/sign-in", headers=PAGE)).text
    href = re.search(r'href="(/console/static/console\.css\?v=[0-9a-f]+)"', page)
    assert href
    css = await browser.get(href.group(1))
    assert css.status_code == 200
    assert css.headers["content-type"].startswith("text/css")
    assert "immutable" in css.headers["cache-control"]
    assert css.headers["x-content-type-options"] == "nosniff"
    again = await browser.get(href.group(1), headers={"if-none-match": css.headers["etag"]})
    assert again.status_code == 304
    assert (await browser.get("/console/static/nope.css")).status_code == 404
    assert (await browser.get("/console/static/../session.py")).status_code == 404


# -- no inline code ----------------------------------------------------------------------------------

class InlineFinder(HTMLParser):
    """Collects what the policy would block: inline scripts, style elements and attributes, handlers."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {name.lower() for name, _ in attrs}
        if tag == "script" and "src" not in names:
            self.found.append("<script> without src")
        if tag == "style":
            self.found.append("<style>")
        self.found += [f"{tag} {name}=" for name in names if name == "style" or name.startswith("on")]
        self.found += [f"{tag} {name}=javascript:" for name, value in attrs
                       if value and value.strip().lower().startswith("javascript:")]


async def test_no_page_has_inline_script_or_style(operator: httpx.AsyncClient, browser: httpx.AsyncClient) -> None:
    pages = [await operator.get(path, headers=PAGE) for path in ("/console", "/console/tools", "/console/sign-in")]
    pages += [await sign_in(browser, "wrong-token-0123456789"), await sign_in(browser, AGENT_KEY),
              await operator.post("/console/sign-out", data={}, headers=ORIGIN)]
    for page in pages:
        assert page.headers["content-type"].startswith("text/html")
        finder = InlineFinder()
        finder.feed(page.text)
        assert finder.found == [], page.url
