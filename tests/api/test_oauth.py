"""OAuth access tokens over the carmy/1 routes and /mcp: the app in process (its lifespan
running) against a real worker, and an issuer whose key set is served over HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.applications import Starlette

from api.app import create_app
from api.guards.oauth import OAuthSettings
from api.settings import ApiKey, ApiSettings
from tests.conftest import asgi_client
from tests.issuer import ISSUER, RESOURCE, Issuer, challenge, hs256_with, issuing, new_key, reheaded, tampered, unsigned
from tests.support import Proc, Stack, app_settings, free_port, serving

API_KEY = "alice-token-0123456789"
METADATA = "https://carmy.test/.well-known/oauth-protected-resource"
MCP_METADATA = METADATA + "/mcp"
ACCEPT_MCP = {"accept": "application/json, text/event-stream"}
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    with issuing(new_key("rsa-1"), new_key("ec-1", "ES256"), new_key("ed-1", "EdDSA")) as i:
        yield i


def settings(stack: Stack, issuer: Issuer, **oauth: Any) -> ApiSettings:
    return app_settings(stack.redis_url, api_keys={API_KEY: ApiKey(principal="alice")},
                        oauth=OAuthSettings(issuer=ISSUER, resource=RESOURCE, jwks_url=issuer.jwks_url, **oauth))


@pytest.fixture(scope="module")
def asgi_app(stack: Stack, issuer: Issuer) -> Starlette:
    # Unknown kids may refresh the key set once an hour: the tests below count the fetches.
    return create_app(settings(stack, issuer, jwks_min_refresh=3600))


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def whoami(client: httpx.AsyncClient, token: str) -> httpx.Response:
    return await client.post("/agent/execute", json={"tool": "whoami"}, headers=bearer(token))


@pytest.mark.parametrize("kid", ["rsa-1", "ec-1", "ed-1"])
async def test_a_valid_token_names_the_caller_and_its_scopes(client: httpx.AsyncClient, issuer: Issuer,
                                                             kid: str) -> None:
    key = next(k for k in issuer.keys if k.kid == kid)
    r = await whoami(client, issuer.token(key))
    assert r.status_code == 200, r.text
    assert r.json()["data"] == {"principal": "user-1", "session": None, "permissions": ["confirm:wipe", "tools:read"],
                                "request_id": None}
    # The scope confirm:wipe is the permission the destructive tool asks for.
    wiped = await client.post("/agent/execute", json={"tool": "wipe"}, headers=bearer(issuer.token(key)))
    assert wiped.status_code == 200
    unscoped = await client.post("/agent/execute", json={"tool": "wipe"},
                                 headers=bearer(issuer.token(key, scope="tools:read")))
    assert unscoped.json()["error"]["code"] == "CONFIRMATION_REQUIRED"


async def test_clock_skew_within_the_leeway_is_tolerated(client: httpx.AsyncClient, issuer: Issuer) -> None:
    iat = int(issuer.claims()["iat"])
    for token in (issuer.token(exp=iat - 10), issuer.token(nbf=iat + 10)):  # the leeway is 30 s
        assert (await whoami(client, token)).status_code == 200


async def test_api_keys_still_work_alongside(client: httpx.AsyncClient) -> None:
    r = await whoami(client, API_KEY)
    assert r.status_code == 200
    assert r.json()["data"]["principal"] == "alice"


def refusals(issuer: Issuer) -> dict[str, str]:
    good = issuer.token()
    claims = issuer.claims()
    rsa = issuer.keys[0]
    return {
        "expired": issuer.token(exp=int(claims["iat"]) - 120),
        "not yet valid": issuer.token(nbf=int(claims["iat"]) + 120),
        "wrong audience": issuer.token(aud="https://elsewhere.test"),
        "audience of another path": issuer.token(aud=RESOURCE + "/other"),
        "wrong issuer": issuer.token(iss="https://evil.test"),
        "no exp": issuer.token(exp=None),
        "no sub": issuer.token(sub=None),
        "unknown kid": issuer.token(new_key("rsa-1"), headers={"kid": "rotated-away"}),
        "same kid, other key": issuer.token(new_key("rsa-1")),
        "alg none": unsigned(claims, rsa.kid),
        "HS256 with the RSA public key": hs256_with(rsa.public_pem(), claims, rsa.kid),
        "HS256 with the JWK's n": hs256_with(rsa.jwk()["n"].encode(), claims, rsa.kid),
        "tampered payload": tampered(good, sub="mallory"),
        "tampered scope": tampered(good, scope="confirm:everything"),
        "ES256 header on the RSA key": reheaded(good, alg="ES256"),
        "EdDSA header on the RSA key": reheaded(good, alg="EdDSA"),
        "not a JWT": "not-a-jwt-and-not-a-key",
        "garbage JWT": "a.b.c",
    }


@pytest.mark.parametrize("case", list(refusals(Issuer([new_key("x")]))))
async def test_invalid_tokens_are_refused_with_a_challenge(client: httpx.AsyncClient, issuer: Issuer,
                                                          case: str) -> None:
    r = await whoami(client, refusals(issuer)[case])
    assert r.status_code == 401, r.text
    assert r.json()["error"]["code"] == "UNAUTHENTICATED"
    assert r.headers["cache-control"] == "no-store"
    params = challenge(r.headers["www-authenticate"])
    assert params["resource_metadata"] == METADATA
    assert params["error"] == "invalid_token"
    assert params["error_description"] == r.json()["error"]["details"]["reason"]


async def test_a_missing_token_gets_the_challenge_without_an_error(client: httpx.AsyncClient) -> None:
    for headers in ({}, {"authorization": "Basic dXNlcjpwYXNz"}):
        r = await client.post("/agent/execute", json={"tool": "whoami"}, headers=headers)
        assert r.status_code == 401
        assert challenge(r.headers["www-authenticate"]) == {"resource_metadata": METADATA}
    r = await client.get("/agent/tools")
    assert challenge(r.headers["www-authenticate"]) == {"resource_metadata": METADATA}


async def test_garbage_kids_do_not_make_us_hammer_the_issuer(client: httpx.AsyncClient, issuer: Issuer) -> None:
    assert (await whoami(client, issuer.token())).status_code == 200  # the key set is fetched by now
    before = issuer.hits
    for i in range(20):
        r = await whoami(client, issuer.token(headers={"kid": f"made-up-{i}"}))
        assert r.status_code == 401
    assert issuer.hits == before  # fetched at most once per jwks_min_refresh (an hour here)


async def test_metadata_documents(client: httpx.AsyncClient) -> None:
    root = await client.get("/.well-known/oauth-protected-resource")
    mcp = await client.get("/.well-known/oauth-protected-resource/mcp")
    assert root.status_code == mcp.status_code == 200
    assert root.headers["content-type"] == "application/json"
    expected = {"authorization_servers": [ISSUER], "bearer_methods_supported": ["header"], "resource_name": "Carmy"}
    assert root.json() == {"resource": RESOURCE, **expected}
    assert mcp.json() == {"resource": RESOURCE + "/mcp", **expected}


async def test_mcp_challenge_and_audiences(client: httpx.AsyncClient, issuer: Issuer) -> None:
    r = await client.post("/mcp", json=PING, headers=ACCEPT_MCP)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "UNAUTHENTICATED"
    assert challenge(r.headers["www-authenticate"]) == {"resource_metadata": MCP_METADATA}
    refused = await client.post("/mcp", json=PING, headers={**ACCEPT_MCP, **bearer(issuer.token(exp=1))})
    assert refused.status_code == 401
    assert challenge(refused.headers["www-authenticate"])["error"] == "invalid_token"
    # At /mcp, a token for the deployment or for its MCP endpoint (the path-suffixed document's
    # resource); elsewhere, for the deployment only.
    mcp_token = issuer.token(aud=RESOURCE + "/mcp")
    for token in (issuer.token(), mcp_token):
        r = await client.post("/mcp", json=PING, headers={**ACCEPT_MCP, **bearer(token)})
        assert r.status_code == 200, r.text
    assert (await whoami(client, mcp_token)).status_code == 401


async def test_required_scopes(stack: Stack, worker: Proc, issuer: Issuer) -> None:
    async with asgi_client(create_app(settings(stack, issuer, scopes=("carmy",)))) as c:
        missing = await c.get("/agent/tools")
        assert challenge(missing.headers["www-authenticate"]) == {"resource_metadata": METADATA, "scope": "carmy"}
        r = await whoami(c, issuer.token())
        assert r.status_code == 403
        assert r.json()["error"]["code"] == "INSUFFICIENT_SCOPE"
        params = challenge(r.headers["www-authenticate"])
        assert (params["error"], params["scope"], params["resource_metadata"]) == ("insufficient_scope", "carmy",
                                                                                   METADATA)
        assert (await whoami(c, issuer.token(scope="carmy tools:read"))).status_code == 200
        meta = await c.get("/.well-known/oauth-protected-resource")
        assert meta.json()["scopes_supported"] == ["carmy"]


async def test_rotation_new_kid_accepted_after_refresh(stack: Stack, worker: Proc) -> None:
    with issuing(new_key("old")) as issuer:
        async with asgi_client(create_app(settings(stack, issuer, jwks_min_refresh=0.2))) as c:
            assert (await whoami(c, issuer.token())).status_code == 200
            new = new_key("new", "ES256")
            issuer.keys = [new]  # the issuer rotates: the old key is gone, a new one signs
            token = issuer.token(new)

            # Refused until a refresh is allowed (0.2 s after the last fetch), then accepted.
            await until(lambda: whoami(c, token), lambda r: r.status_code == 200, "the new kid accepted")
            assert (await whoami(c, issuer.token(new_key("old")))).status_code == 401


async def until(call: Callable[[], Awaitable[httpx.Response]], done: Callable[[httpx.Response], bool], what: str,
                timeout: float = 30.0) -> httpx.Response:
    """``call()`` again and again until its answer is ``done``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = await call()
        if done(response):
            return response
        await asyncio.sleep(0.02)
    raise TimeoutError(f"{what}: not within {timeout:g} s (last: {response.status_code} {response.text})")


@pytest.mark.slow
async def test_an_outage_with_a_cached_key_set_keeps_working(stack: Stack, worker: Proc) -> None:
    with issuing(new_key("k")) as issuer:
        # The key set is stale at once: every request wants a fresh one, at most every 0.05 s.
        async with asgi_client(create_app(settings(stack, issuer, jwks_max_age=0.01, jwks_min_refresh=0.05))) as c:
            assert (await whoami(c, issuer.token())).status_code == 200
            issuer.status = 500
            fetched = issuer.hits

            def ok_after_a_failed_fetch(r: httpx.Response) -> bool:
                assert r.status_code == 200, r.text  # every answer meanwhile, too
                return issuer.hits > fetched + 1

            await until(lambda: whoami(c, issuer.token()), ok_after_a_failed_fetch, "two failed fetches")
            issuer.status = 200


async def test_an_unreachable_issuer_without_keys_is_not_the_callers_fault(stack: Stack, worker: Proc) -> None:
    issuer = Issuer([new_key("k")], jwks_url=f"http://127.0.0.1:{free_port()}/jwks")  # nothing listens
    async with asgi_client(create_app(settings(stack, issuer))) as c:
        r = await whoami(c, issuer.token())
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "AUTH_UNAVAILABLE"
        assert r.json()["error"]["retryable"] is True
        assert int(r.headers["retry-after"]) >= 1
        assert "www-authenticate" not in r.headers
        # No token is still the caller's fault.
        assert (await c.get("/agent/tools")).status_code == 401


@contextlib.asynccontextmanager
async def mcp_client(url: str, token: str) -> AsyncIterator[Any]:
    async with httpx2.AsyncClient(headers=bearer(token), timeout=httpx2.Timeout(10, read=60)) as http, \
            Client(streamable_http_client(url, http_client=http)) as client:
        yield client


async def test_mcp_tool_sees_the_token_caller(stack: Stack, worker: Proc, issuer: Issuer) -> None:
    with serving(create_app(settings(stack, issuer))) as base:
        async with mcp_client(base + "/mcp", issuer.token(aud=RESOURCE + "/mcp", sub="mcp-user")) as client:
            who = await client.call_tool("whoami")
    assert who.structured_content == {"principal": "mcp-user", "session": None,
                                      "permissions": ["confirm:wipe", "tools:read"], "request_id": None}
