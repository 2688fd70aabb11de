"""API keys and access tokens over a real socket: the key is checked before the body is read."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx

from tests.issuer import ISSUER, RESOURCE, Issuer, challenge, new_key
from tests.support import Stack

TOKEN = "carol-token-0123456789"


def test_unauthenticated_request_is_answered_without_reading_the_body(stack: Stack) -> None:
    keys = json.dumps({TOKEN: {"principal": "carol", "permissions": []}})
    _, base = stack.api({"CARMY_API_KEYS": keys})
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=3) as s:
        # Announce a body and never send it: reading it first would hang until the timeout.
        s.sendall(b"POST /agent/execute HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n")
        received = b""
        while b"UNAUTHENTICATED" not in received:  # head and body may come in separate segments
            chunk = s.recv(4096)
            if not chunk:
                break
            received += chunk
    assert received.startswith(b"HTTP/1.1 401")
    assert b"UNAUTHENTICATED" in received


def test_access_tokens_of_the_configured_issuer(stack: Stack, tmp_path: Path) -> None:
    """``python -m api`` with CARMY_OAUTH_* (a key file): the settings reach the served app."""
    stack.worker()
    key = new_key("k", "EdDSA")
    issuer = Issuer([key])
    (tmp_path / "jwks.json").write_bytes(issuer.jwks_document())
    _, base = stack.api({"CARMY_OAUTH_ISSUER": ISSUER, "CARMY_OAUTH_RESOURCE": RESOURCE,
                         "CARMY_OAUTH_JWKS_FILE": str(tmp_path / "jwks.json"), "CARMY_OAUTH_SCOPES": "tools:read"})
    with httpx.Client(base_url=base, timeout=30) as client:
        refused = client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert refused.status_code == 401
        assert challenge(refused.headers["www-authenticate"]) == {
            "resource_metadata": "https://carmy.test/.well-known/oauth-protected-resource/mcp", "scope": "tools:read"}
        assert client.get("/.well-known/oauth-protected-resource").json()["resource"] == RESOURCE
        r = client.post("/agent/execute", json={"tool": "whoami"},
                        headers={"authorization": f"Bearer {issuer.token()}"})
        assert r.status_code == 200, r.text
        assert r.json()["data"]["principal"] == "user-1"


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def test_trusted_tokens_are_kept_by_digest_so_large_ones_cannot_grow_the_api(stack: Stack, tmp_path: Path) -> None:
    """1,100 distinct valid tokens of 48 KiB each (the header limit allows 64): the API keeps a
    digest of each it trusts, not the token, so its memory stays where it was (before: ~50 MiB
    more, up to 64 with the cache's 1,024 entries)."""
    key = new_key("k", "EdDSA")
    issuer = Issuer([key])
    (tmp_path / "jwks.json").write_bytes(issuer.jwks_document())
    api, base = stack.api({"CARMY_OAUTH_ISSUER": ISSUER, "CARMY_OAUTH_RESOURCE": RESOURCE,
                           "CARMY_OAUTH_JWKS_FILE": str(tmp_path / "jwks.json")})
    padding = "p" * 36_000  # a claim nobody reads: base64url makes the token ~48 KiB

    def lookup_with(n: int) -> int:
        token = issuer.token(pad=f"{n}{padding}")
        r = client.get(f"/agent/executions/exec_{n:08d}-0000-4000-8000-000000000000",
                       headers={"authorization": f"Bearer {token}"})
        return r.status_code

    with httpx.Client(base_url=base, timeout=30) as client:
        assert {lookup_with(n) for n in range(100)} == {404}  # verified, and nothing to find
        before = rss_kib(api.pid)
        assert {lookup_with(n) for n in range(100, 1200)} == {404}
        grown = rss_kib(api.pid) - before
    assert grown < 16 * 1024, f"the API grew by {grown} KiB"
