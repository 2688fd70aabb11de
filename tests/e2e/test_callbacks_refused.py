"""Callbacks to forbidden addresses, through ``python -m api`` and a real worker with loopback
not allowed: a name that resolves to 127.0.0.1, 127.0.0.1 itself and the cloud metadata address
are never connected to (the receiver, listening on 127.0.0.1, sees nothing), and the job's view
says why, after one attempt: a refused address is final. A host ``CARMY_NOTIFY_HOSTS`` does not
name, or an API without ``CARMY_NOTIFY_SECRET``, refuses the job at creation."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.callbacks import SECRET, Receiver, receiver
from tests.e2e.test_callbacks import notified
from tests.e2e.test_jobs_api import AS_ALICE, KEYS, Api, job_api
from tests.support import Stack

STRICT = {"CARMY_NOTIFY_SECRET": SECRET, "CARMY_NOTIFY_HOSTS": "localhost,127.0.0.1,169.254.169.254"}


@pytest.fixture(scope="module")
def hook() -> Iterator[Receiver]:
    with receiver() as r:
        yield r


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[Api]:
    with job_api(stack, STRICT) as a:
        yield a


@pytest.mark.parametrize(("host", "why"), [
    ("localhost", "a loopback address"),
    ("127.0.0.1", "a loopback address"),
    ("169.254.169.254", "a cloud metadata address"),
])
def test_a_forbidden_address_is_never_connected_to(api: Api, hook: Receiver, host: str, why: str) -> None:
    port = hook.port if host != "169.254.169.254" else 80
    url = f"http://{host}:{port}/{host}"
    job = api.create("stamp", f"refused-{host}", notify={"url": url})
    done = notified(api, job["job_id"], "undeliverable")
    [attempt] = done["notify"]["deliveries"]
    assert why in attempt["error"] and "refused" in attempt["error"] and "status" not in attempt
    assert done["notify"]["delivered"] is False and done["status"] == "succeeded"
    assert hook.to(f"/{host}") == []


def test_a_host_not_allowed_is_refused_at_creation(api: Api) -> None:
    r = api.client.post(api.base + "/agent/jobs", json={
        "tool": "stamp", "arguments": {"name": "x"}, "notify": {"url": "https://hooks.example.com/x"}},
        headers=AS_ALICE)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "INVALID_REQUEST" and error["details"] == {"field": "notify.url"}
    assert "hooks.example.com" in error["message"] and "CARMY_NOTIFY_HOSTS" in error["message"]


@pytest.mark.parametrize("url", ["http://localhost/a b", "http://localhost/a\r\nX-Injected: 1", "http://localhost/\tx",
                                 "http://localhost/caf\u00e9", "http://localhost/\x00", "http://localhost/\x7f"])
def test_a_url_no_request_line_can_carry_is_refused_at_creation(api: Api, url: str) -> None:
    """A space or a control character would break the callback's request line (Python's urlsplit
    drops tabs and line breaks without a word, so the URL called would not be the one given), and
    a character outside ASCII belongs percent-encoded."""
    r = api.client.post(api.base + "/agent/jobs", json={
        "tool": "stamp", "arguments": {"name": "x"}, "notify": {"url": url}}, headers=AS_ALICE)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "INVALID_REQUEST" and error["details"] == {"field": "notify.url"}


def test_an_api_without_the_secret_refuses_notify(stack: Stack, hook: Receiver) -> None:
    _, base = stack.api({"CARMY_API_KEYS": KEYS, "CARMY_NOTIFY_HOSTS": "127.0.0.1"})
    r = httpx.post(base + "/agent/jobs", json={"tool": "stamp", "arguments": {"name": "x"},
                                               "notify": {"url": hook.url("/x")}}, headers=AS_ALICE)
    assert r.status_code == 400 and "CARMY_NOTIFY_SECRET" in r.json()["error"]["message"]
