"""A browser cannot be turned against ``python -m api`` (run as ``bin/run`` runs it: bound to
loopback, no API keys): bodies must be JSON, the Host must be one the API answers to (DNS
rebinding), and an Origin must be the API's own or an allowed CORS origin (cross-site pages).
Agents, curl and SDKs, which send JSON and no Origin, are unaffected."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.raw import authority, connect, read_whole_response, until_closed
from tests.support import Stack, wait_until

APP = "https://app.example"  # the one allowed CORS origin
EVIL = "https://evil.example"
TOKEN = "dave-token-0123456789"
EXECUTION = "/agent/executions/exec_0b9d7c1e-5f3a-4e2b-9c41-7d2a8e6f1b30"
JOB = "/agent/jobs/job_0b9d7c1e-5f3a-4e2b-9c41-7d2a8e6f1b30"
MCP_ACCEPT = "application/json, text/event-stream"
INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}


@pytest.fixture(scope="module")
def base(stack: Stack) -> Iterator[str]:
    """Bound to 127.0.0.1 (the default), no API keys, one CORS origin."""
    stack.worker()
    _, url = stack.api({"CARMY_CORS_ORIGINS": APP})
    wait_until(lambda: "noop" in httpx.get(url + "/agent/tools").text)
    yield url


def execute(base: str, content_type: str | None, **headers: str) -> httpx.Response:
    body = json.dumps({"tool": "noop", "arguments": {}})
    if content_type is not None:
        headers["content-type"] = content_type
    return httpx.post(base + "/agent/execute", content=body, headers=headers)


def create_job(base: str, content_type: str | None, **headers: str) -> httpx.Response:
    """A job a cross-site page would like to queue: it would run later, with nobody watching."""
    body = json.dumps({"tool": "noop", "arguments": {}, "delay_ms": 60_000})
    if content_type is not None:
        headers["content-type"] = content_type
    return httpx.post(base + "/agent/jobs", content=body, headers=headers)


def initialize(base: str, content_type: str | None, **headers: str) -> httpx.Response:
    if content_type is not None:
        headers["content-type"] = content_type
    return httpx.post(base + "/mcp", content=json.dumps(INITIALIZE), headers={"accept": MCP_ACCEPT, **headers})


def error_code(r: httpx.Response) -> str:
    code: str = r.json()["error"]["code"]
    return code


# -- Content-Type: only JSON, so that no CORS-simple request can carry a call ------------------

SIMPLE_TYPES = [None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x"]


@pytest.mark.parametrize("content_type", SIMPLE_TYPES)
def test_a_body_that_is_not_declared_json_gets_415(base: str, content_type: str | None) -> None:
    for r in (execute(base, content_type), initialize(base, content_type), create_job(base, content_type)):
        assert r.status_code == 415
        assert error_code(r) == "UNSUPPORTED_MEDIA_TYPE"
        assert r.headers["accept"] == "application/json"


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "Application/JSON;charset=UTF-8", "application/vnd.foo+json"])
def test_json_in_any_of_its_spellings_is_served(base: str, content_type: str) -> None:
    r = execute(base, content_type)
    assert r.json()["status"] == "completed"


def test_mcp_takes_json_with_parameters(base: str) -> None:
    assert initialize(base, "application/json; charset=utf-8").status_code == 200


# -- Host and Origin, on every route that does something -----------------------------------------

def routes(base: str, **headers: str) -> dict[str, httpx.Response]:
    """One request to each guarded route, with ``headers``."""
    return {
        "execute": execute(base, "application/json", **headers),
        "get": httpx.get(base + EXECUTION, headers=headers),
        "delete": httpx.delete(base + EXECUTION, headers=headers),
        "mcp": initialize(base, "application/json", **headers),
        "tools": httpx.get(base + "/agent/tools", headers=headers),
        "create_job": create_job(base, "application/json", **headers),
        "jobs": httpx.get(base + "/agent/jobs", headers=headers),
        "cancel_job": httpx.delete(base + JOB, headers=headers),
        "retry_job": httpx.post(base + JOB + "/retry", headers=headers),
        "schedules": httpx.get(base + "/agent/schedules", headers=headers),
    }


def assert_served(answers: dict[str, httpx.Response]) -> None:
    assert answers["execute"].json()["status"] == "completed"
    for name in ("get", "delete"):  # the guard let them through to the lookup
        assert error_code(answers[name]) == "EXECUTION_NOT_FOUND"
    assert answers["mcp"].status_code == 200
    assert answers["tools"].status_code == 200
    assert answers["create_job"].status_code == 202
    for name in ("jobs", "schedules"):
        assert answers[name].status_code == 200
    assert error_code(answers["cancel_job"]) == "JOB_NOT_FOUND"
    assert error_code(answers["retry_job"]) == "OPERATOR_REQUIRED"  # no keys: nobody is an operator


def assert_refused(answers: dict[str, httpx.Response], code: str) -> None:
    for name, r in answers.items():
        assert (r.status_code, error_code(r)) == (403, code), name


def test_loopback_names_with_any_port_are_served(base: str) -> None:
    port = authority(base).split(":")[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost", "LOCALHOST:1"):
        assert_served(routes(base, host=host))


def test_any_other_host_is_refused(base: str) -> None:
    assert_refused(routes(base, host="evil.example"), "HOST_NOT_ALLOWED")


def test_dns_rebinding_is_refused(base: str) -> None:
    # A page at http://evil.example:<port>, whose name now resolves to 127.0.0.1: to the browser
    # this is a same-origin request, so only the Host it asks for gives it away.
    page = "evil.example:" + authority(base).split(":")[1]
    assert_refused(routes(base, host=page, origin="http://" + page), "HOST_NOT_ALLOWED")


def absolute_form(base: str, target: str, host: str) -> tuple[int, dict[str, object]]:
    """``GET <target> HTTP/1.1`` with an absolute-form target, as a proxy sends it."""
    with connect(base) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        head, body = read_whole_response(sock)
    return int(head.split()[1]), json.loads(body)


def test_an_absolute_form_target_is_judged_by_its_own_host(base: str) -> None:
    # RFC 9112 §3.2.2: the target's authority replaces Host, which a rebinding page cannot
    # then use to slip another name past the check.
    status, body = absolute_form(base, "http://evil.example/agent/tools", authority(base))
    assert (status, body["error"]["code"]) == (403, "HOST_NOT_ALLOWED")  # type: ignore[index]
    assert "evil.example" in body["error"]["message"]  # type: ignore[index]
    status, body = absolute_form(base, f"http://{authority(base)}/agent/tools", "evil.example")
    assert status == 200 and "tools" in body
    status, _ = absolute_form(base, "http://[::1]:1/agent/tools", "evil.example")
    assert status == 200  # a loopback name with any port, as in Host


def test_another_sites_origin_is_refused(base: str) -> None:
    for origin in (EVIL, "null", "http://localhost:1", APP + ".evil.example"):
        assert_refused(routes(base, origin=origin), "ORIGIN_NOT_ALLOWED")


def test_the_servers_own_origin_and_cors_origins_are_served(base: str) -> None:
    assert_served(routes(base, origin="http://" + authority(base)))
    answers = routes(base, origin=APP)
    assert_served(answers)
    assert answers["execute"].headers["access-control-allow-origin"] == APP


def test_requests_without_origin_are_served(base: str) -> None:
    assert_served(routes(base))


def test_probes_answer_any_host_and_origin(base: str) -> None:
    # Orchestrators call them by the address they know (Kubernetes: the pod's IP).
    for path in ("/health", "/ready"):
        r = httpx.get(base + path, headers={"host": "10.1.2.3:8000", "origin": EVIL})
        assert r.status_code == 200


def test_cors_preflight_of_an_allowed_origin_still_works(base: str) -> None:
    r = httpx.options(base + "/agent/execute", headers={
        "origin": APP, "access-control-request-method": "POST", "access-control-request-headers": "content-type"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == APP


# -- Checked first: before the API key, before the body ---------------------------------------

def test_host_and_origin_are_checked_before_the_key_and_the_body(stack: Stack) -> None:
    keys = json.dumps({TOKEN: {"principal": "dave", "permissions": []}})
    _, keyed = stack.api({"CARMY_API_KEYS": keys})
    for extra in (b"Host: evil.example", b"Host: localhost\r\nOrigin: " + EVIL.encode()):
        with connect(keyed) as sock:
            # No key, and a body announced but never sent: reading it would wait for ever.
            sock.sendall(b"POST /agent/execute HTTP/1.1\r\n%s\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100000\r\nConnection: close\r\n\r\n" % extra)
            _, received = until_closed(sock)
        assert received.startswith(b"HTTP/1.1 403 ")
