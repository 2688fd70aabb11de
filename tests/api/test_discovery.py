"""The two discovery documents: fields, headers, ETags and conditional requests."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest

from api.settings import ApiSettings
from tests.support import Stack, app_settings


@pytest.fixture(scope="module")
def api_settings(stack: Stack) -> ApiSettings:
    """A server name of our own, which the discovery document must show."""
    return app_settings(stack.redis_url, server_name="shop-test")


def check_document_headers(response: httpx.Response) -> None:
    assert response.headers["cache-control"] == "private, max-age=60"
    assert response.headers["content-type"] == "application/json"
    assert response.headers["etag"] == f'"{hashlib.sha256(response.content).hexdigest()}"'


async def test_discovery_document(client: httpx.AsyncClient) -> None:
    r = await client.get("/.well-known/agent")
    assert r.status_code == 200
    check_document_headers(r)
    tools = await client.get("/agent/tools")
    assert r.json() == {
        "protocol": "carmy/1",
        "server": "shop-test",
        "capabilities": ["tools", "streaming", "idempotency", "async", "mcp", "jobs"],
        "tools_url": "/agent/tools",
        "tools_version": tools.headers["etag"].strip('"'),
        "execute_url": "/agent/execute",
        "mcp_url": "/mcp",
        "jobs_url": "/agent/jobs",
    }
    assert list(r.json()) == ["protocol", "server", "capabilities", "tools_url", "tools_version", "execute_url",
                              "mcp_url", "jobs_url"]


async def test_catalog_document(client: httpx.AsyncClient) -> None:
    r = await client.get("/agent/tools")
    assert r.status_code == 200
    check_document_headers(r)
    tools = r.json()["tools"]
    names = [t["name"] for t in tools]
    assert names == sorted(names)
    assert {"noop", "echo", "echo_sync", "wipe", "publish"} <= set(names)
    echo = next(t for t in tools if t["name"] == "echo")
    assert echo == {
        "name": "echo",
        "description": "Echo the text.",
        "input_schema": {
            "title": "EchoInput", "type": "object",
            "properties": {"text": {"type": "string"}, "times": {"type": "integer", "default": 1}},
            "required": ["text"], "additionalProperties": False,
        },
        "output_schema": {
            "title": "EchoOutput", "type": "object", "properties": {"text": {"type": "string"}},
            "required": ["text"], "additionalProperties": False,
        },
        "effect": "read",
        "idempotent": True,
        "parallel_safe": True,
        "confirmation": "none",
    }
    for tool in tools:
        assert tool["input_schema"]["type"] == "object"
        assert "$ref" not in tool["input_schema"]
    wipe = next(t for t in tools if t["name"] == "wipe")
    # Declared without confirmation="required", but destructive: it needs one all the same.
    assert (wipe["effect"], wipe["confirmation"], wipe["parallel_safe"]) == ("destructive", "required", False)
    assert next(t for t in tools if t["name"] == "publish")["confirmation"] == "required"


@pytest.mark.parametrize("path", ["/.well-known/agent", "/agent/tools"])
async def test_if_none_match_forms(client: httpx.AsyncClient, path: str) -> None:
    first = await client.get(path)
    etag = first.headers["etag"]
    for header in (etag, f"W/{etag}", f'"nope", {etag}', "*"):
        r = await client.get(path, headers={"if-none-match": header})
        assert r.status_code == 304, header
        assert r.content == b""
        assert r.headers["etag"] == etag
        assert r.headers["cache-control"] == "private, max-age=60"
        assert r.headers["content-type"] == "application/json"
    for header in ('"other"', 'W/"other", "x"', ""):
        r = await client.get(path, headers={"if-none-match": header})
        assert r.status_code == 200, header
        assert r.content == first.content


async def test_documents_are_stable_bytes(client: httpx.AsyncClient) -> None:
    a = await client.get("/agent/tools")
    b = await client.get("/agent/tools")
    assert a.content == b.content
    json.loads(a.content)
