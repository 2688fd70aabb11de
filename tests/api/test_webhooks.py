"""``POST /agent/webhooks/{name}`` in process, against the real Redis and a real worker of
``tests.toolsets.jobs``, whose tools write each run to a file (what really ran, counted outside
Redis): each verification scheme signed, tampered, unsigned and with a wrong secret; Standard
Webhooks' stale timestamps; redeliveries replayed; both modes; the refusals; discovery and
``/ready``; secrets never echoed or logged. Deliveries are signed as their senders sign them:
GitHub's hex HMAC, and the ``standardwebhooks`` package."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook as StandardSigner

from api.settings import ApiKey, ApiSettings
from api.settings.webhooks import parse_webhooks
from carmy_worker import signatures
from carmy_worker.settings import SettingsError
from carmy_worker.store.jobstore import FINISHED
from tests.support import Proc, Stack, app_settings, wait_until_async

GH_SECRET = "gh-secret-9f3a7c1e5b"
SW_SECRET = "whsec_" + base64.b64encode(b"standard-webhooks-key-0123456789").decode()
SHARED_SECRET = "shared-secret-42d8e0b6"
SECRETS = (GH_SECRET, SW_SECRET, SW_SECRET.removeprefix("whsec_"), SHARED_SECRET)
SENDER_KEY = "sender-token-0123456789"
OPS_KEY = "ops-token-0123456789abc"
ENV = {"GH_SECRET": GH_SECRET, "SW_SECRET": SW_SECRET, "SHARED_SECRET": SHARED_SECRET}
GITHUB = {"scheme": "hmac-sha256", "header": "X-Hub-Signature-256", "secret_env": "GH_SECRET"}
WEBHOOKS = {
    "gh": {"tool": "stamp", "verify": GITHUB, "event_id": "X-GitHub-Delivery"},
    "gh-job": {"tool": "stamp", "verify": GITHUB, "event_id": "X-GitHub-Delivery", "mode": "job"},
    "sw": {"tool": "stamp", "verify": {"scheme": "standard-webhooks", "secret_env": "SW_SECRET"},
           "event_id": "webhook-id"},
    "shared": {"tool": "stamp", "verify": {"scheme": "header-secret", "header": "X-Token",
                                           "secret_env": "SHARED_SECRET"},
               "event_id": "/id", "arguments": "/payload"},
    "open": {"tool": "stamp", "verify": "none"},
    "keyed": {"tool": "stamp", "verify": "none", "auth": "api-key"},
    "ghost": {"tool": "no_such_tool", "verify": "none"},
}


@pytest.fixture(scope="module")
def worker(stack: Stack) -> Proc:
    return stack.worker("tests.toolsets.jobs")


@pytest.fixture(scope="module")
def api_settings(stack: Stack) -> ApiSettings:
    return app_settings(stack.redis_url, webhooks=parse_webhooks(json.dumps(WEBHOOKS), ENV), api_keys={
        SENDER_KEY: ApiKey(principal="sender"),
        OPS_KEY: ApiKey(principal="ops", permissions=frozenset({"carmy:operator"}))})


def runs(stack: Stack, name: str) -> list[str]:
    """The request ids of ``stamp``'s runs for ``name``."""
    path: Path = stack.tmp / f"stamp-{name}"
    return [line.split(" ", 1)[1] for line in path.read_text().splitlines()] if path.exists() else []


def github(body: bytes, secret: str = GH_SECRET, delivery: str | None = None) -> dict[str, str]:
    """GitHub's headers: ``X-Hub-Signature-256: sha256=<hex>`` and a delivery id."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"x-hub-signature-256": f"sha256={digest}", "x-github-delivery": delivery or str(uuid.uuid4()),
            "content-type": "application/json"}


def standard(body: bytes, secret: str = SW_SECRET, msg_id: str | None = None,
             at: float | None = None) -> dict[str, str]:
    """Standard Webhooks' headers, signed by the reference library."""
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    when = datetime.fromtimestamp(time.time() if at is None else at, tz=UTC)
    signature = StandardSigner(secret).sign(msg_id, when, body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(when.timestamp())), "webhook-signature": signature,
            "content-type": "application/json"}


def shared(body: bytes, secret: str = SHARED_SECRET) -> dict[str, str]:
    return {"x-token": secret, "content-type": "application/json"}


def delivery(scheme: str, name: str, event: str | None = None) -> bytes:
    """A body for ``scheme``'s webhook whose arguments are ``{"name": name}``."""
    if scheme == "shared":
        return json.dumps({"id": event or str(uuid.uuid4()), "payload": {"name": name}}).encode()
    return json.dumps({"name": name}).encode()


def tamper(body: bytes) -> bytes:
    """``body`` with its tool's argument changed (the name stamp records)."""
    return body.replace(b'"name": "', b'"name": "tampered-')


def signed(scheme: str, body: bytes, secret: str | None = None, event: str | None = None) -> dict[str, str]:
    if scheme == "gh":
        return github(body, secret or GH_SECRET, event)
    if scheme == "sw":
        return standard(body, secret or SW_SECRET, event)
    return shared(body, secret or SHARED_SECRET)


SCHEMES = ["gh", "sw", "shared"]
WRONG = {"gh": "not-the-secret", "sw": "whsec_" + base64.b64encode(b"another-key-0123456789").decode(),
         "shared": "not-the-secret"}


def unauthorized(response: httpx.Response) -> bool:
    return response.status_code == 401 and response.json()["error"]["code"] == "WEBHOOK_UNAUTHORIZED"


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_signed_delivery_runs_its_tool_with_the_body_as_arguments(
        client: httpx.AsyncClient, stack: Stack, scheme: str) -> None:
    name = f"signed-{scheme}"
    body = delivery(scheme, name)
    r = await client.post(f"/agent/webhooks/{scheme}", content=body, headers=signed(scheme, body))
    assert r.status_code == 200, r.text
    result = r.json()
    assert result["status"] == "completed"
    assert result["data"]["name"] == name and result["data"]["run"] == 1
    assert len(runs(stack, name)) == 1


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_tampered_unsigned_and_wrongly_signed_deliveries_are_refused_and_run_nothing(
        client: httpx.AsyncClient, stack: Stack, scheme: str) -> None:
    name = f"refused-{scheme}"
    body = delivery(scheme, name)
    headers = signed(scheme, body)
    tampered = tamper(body)
    if scheme == "shared":  # a shared secret signs no body: the same secret, another sender's header value
        headers = shared(body, SHARED_SECRET + "x")
    assert unauthorized(await client.post(f"/agent/webhooks/{scheme}", content=tampered, headers=headers))
    assert unauthorized(await client.post(f"/agent/webhooks/{scheme}", content=body,
                                          headers={"content-type": "application/json"}))
    assert unauthorized(await client.post(f"/agent/webhooks/{scheme}", content=body,
                                          headers=signed(scheme, body, WRONG[scheme])))
    # The same body, signed right, runs: the refusals above were for their signatures alone.
    r = await client.post(f"/agent/webhooks/{scheme}", content=body, headers=signed(scheme, body))
    assert r.status_code == 200, r.text
    assert len(runs(stack, name)) == 1


async def test_a_tampered_body_under_a_valid_signature_is_refused(client: httpx.AsyncClient, stack: Stack) -> None:
    body = delivery("gh", "tampered")
    for scheme, headers in (("gh", github(body)), ("sw", standard(body))):
        r = await client.post(f"/agent/webhooks/{scheme}", content=tamper(body), headers=headers)
        assert unauthorized(r)
    assert runs(stack, "tampered-tampered") == []


async def test_a_standard_webhooks_delivery_outside_the_tolerance_is_refused(
        client: httpx.AsyncClient, stack: Stack) -> None:
    body = delivery("sw", "stale")
    for at, side in ((time.time() - 310, "behind"), (time.time() + 310, "ahead of")):  # signed right, too far from now
        r = await client.post("/agent/webhooks/sw", content=body, headers=standard(body, at=at))
        assert unauthorized(r)
        # Told why: a clock off or a replay is not a wrong secret.
        message = r.json()["error"]["message"]
        assert f"s {side} this server's clock, past the webhook's tolerance of 300 s" in message, message
    # A signature that does not verify says only that, however stale: the clock is told to the secret's holder alone.
    forged = {**standard(body, at=time.time() - 310), "webhook-signature": "v1,AAAA"}
    r = await client.post("/agent/webhooks/sw", content=body, headers=forged)
    assert unauthorized(r) and "signature does not verify" in r.json()["error"]["message"]
    assert runs(stack, "stale") == []
    r = await client.post("/agent/webhooks/sw", content=body, headers=standard(body, at=time.time() - 200))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("digits", [400, 5000])
async def test_a_standard_timestamp_of_absurd_length_is_refused_not_a_fault(client: httpx.AsyncClient,
                                                                           digits: int) -> None:
    """Signed with the secret, but past a float's range (400 digits) or int()'s limit (5000): 401."""
    body, timestamp = delivery("sw", f"absurd-{digits}"), "9" * digits
    key = base64.b64decode(SW_SECRET.removeprefix("whsec_"))
    signed = "v1," + base64.b64encode(signatures.digest(key, b"msg_absurd", timestamp.encode(), body)).decode()
    r = await client.post("/agent/webhooks/sw", content=body, headers={
        "webhook-id": "msg_absurd", "webhook-timestamp": timestamp, "webhook-signature": signed,
        "content-type": "application/json"})
    assert unauthorized(r)


async def test_malformed_standard_signatures_are_refused(client: httpx.AsyncClient) -> None:
    body = delivery("sw", "malformed")
    good = standard(body)
    for signature in ("v1,***", "v2," + good["webhook-signature"][3:], "nonsense", ""):
        r = await client.post("/agent/webhooks/sw", content=body, headers={**good, "webhook-signature": signature})
        assert unauthorized(r)
    # One good signature among others verifies (key rotation).
    r = await client.post("/agent/webhooks/sw", content=body,
                          headers={**good, "webhook-signature": "v1,AAAA " + good["webhook-signature"]})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_redelivery_with_the_same_event_id_replays_instead_of_running_again(
        client: httpx.AsyncClient, stack: Stack, scheme: str) -> None:
    name, event = f"redelivered-{scheme}", f"evt-{uuid.uuid4()}"
    body = delivery(scheme, name, event)
    first = await client.post(f"/agent/webhooks/{scheme}", content=body, headers=signed(scheme, body, event=event))
    again = await client.post(f"/agent/webhooks/{scheme}", content=body, headers=signed(scheme, body, event=event))
    assert first.status_code == again.status_code == 200, again.text
    assert again.json() == first.json()
    assert runs(stack, name) == [event]
    body = delivery(scheme, name)  # another event id (in the body, for "shared"): another run
    other = await client.post(f"/agent/webhooks/{scheme}", content=body, headers=signed(scheme, body))
    assert other.json()["data"]["run"] == 2, other.text


async def test_without_an_event_id_every_delivery_runs(client: httpx.AsyncClient, stack: Stack) -> None:
    body = delivery("open", "every")
    for _ in range(2):
        r = await client.post("/agent/webhooks/open", content=body)
        assert r.status_code == 200, r.text
    assert runs(stack, "every") == ["None", "None"]


async def test_a_delivery_without_the_event_id_its_webhook_names_is_refused(
        client: httpx.AsyncClient, stack: Stack) -> None:
    body = delivery("gh", "no-event")
    headers = {k: v for k, v in github(body).items() if k != "x-github-delivery"}
    r = await client.post("/agent/webhooks/gh", content=body, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == "INVALID_REQUEST"
    assert r.json()["error"]["details"] == {"reason": "event_id"}
    assert runs(stack, "no-event") == []


async def test_job_mode_answers_at_once_and_a_redelivery_is_the_same_job(
        client: httpx.AsyncClient, stack: Stack) -> None:
    event = str(uuid.uuid4())
    body = delivery("gh", "as-a-job")
    r = await client.post("/agent/webhooks/gh-job", content=body, headers=github(body, delivery=event))
    assert r.status_code == 202, r.text
    job = r.json()
    assert set(job) == {"job_id", "request_id"} and job["request_id"] == event
    assert r.headers["location"] == f"/agent/jobs/{job['job_id']}"
    await wait_until_async(lambda: runs(stack, "as-a-job"), what="the job ran")
    again = await client.post("/agent/webhooks/gh-job", content=body, headers=github(body, delivery=event))
    assert again.status_code == 200 and again.json() == job

    view = await finished(client, job["job_id"])
    assert view["status"] == "succeeded" and view["tool"] == "stamp"
    assert runs(stack, "as-a-job") == [event]


async def finished(client: httpx.AsyncClient, job_id: str, timeout: float = 30) -> dict[str, Any]:
    """The job's view (as an operator sees it) once it has finished."""
    deadline = time.monotonic() + timeout
    while True:
        r = await client.get(f"/agent/jobs/{job_id}", headers={"authorization": f"Bearer {OPS_KEY}"})
        view: dict[str, Any] = r.json()
        if view["status"] in FINISHED or time.monotonic() > deadline:
            return view
        await asyncio.sleep(0.02)


async def test_unknown_names_bodies_not_json_and_bad_arguments_are_refused(
        client: httpx.AsyncClient, stack: Stack) -> None:
    r = await client.post("/agent/webhooks/nobody", content=b"{}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "WEBHOOK_NOT_FOUND"
    for body in (b"not json", b'{"name": '):
        r = await client.post("/agent/webhooks/gh", content=body, headers=github(body))
        assert r.status_code == 400 and r.json()["error"]["code"] == "INVALID_REQUEST", r.text
    body = json.dumps({"name": 12}).encode()  # JSON, but not stamp's arguments: refused as any call's
    r = await client.post("/agent/webhooks/gh", content=body, headers=github(body))
    assert r.status_code == 400 and r.json()["status"] == "failed"
    assert r.json()["error"]["code"] == "INVALID_ARGUMENTS"
    body = json.dumps({"id": "e1", "elsewhere": {"name": "x"}}).encode()  # nothing at /payload
    r = await client.post("/agent/webhooks/shared", content=body, headers=shared(body))
    assert r.status_code == 400 and r.json()["error"]["details"] == {"reason": "arguments"}


async def test_a_body_over_the_limit_is_refused(client: httpx.AsyncClient, api_settings: ApiSettings) -> None:
    body = b" " * (api_settings.max_body + 1)
    r = await client.post("/agent/webhooks/open", content=body)
    assert r.status_code == 413 and r.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"


async def test_deliveries_need_no_key_unless_their_webhook_asks_for_one(
        client: httpx.AsyncClient, stack: Stack) -> None:
    body = delivery("open", "keyed")
    r = await client.post("/agent/webhooks/keyed", content=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHENTICATED"
    r = await client.post("/agent/webhooks/keyed", content=body, headers={"authorization": f"Bearer {SENDER_KEY}"})
    assert r.status_code == 200, r.text
    assert len(runs(stack, "keyed")) == 1


async def test_a_page_of_another_site_is_refused_a_server_without_origin_is_not(client: httpx.AsyncClient) -> None:
    body = delivery("open", "origin")
    r = await client.post("/agent/webhooks/open", content=body, headers={"origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "ORIGIN_NOT_ALLOWED"
    r = await client.post("/agent/webhooks/open", content=body, headers={"host": "evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "HOST_NOT_ALLOWED"


async def test_discovery_lists_the_webhooks_and_ready_tells_the_unserved_one(client: httpx.AsyncClient) -> None:
    document = (await client.get("/.well-known/agent")).json()
    assert "webhooks" in document["capabilities"]
    assert document["webhooks"] == [f"/agent/webhooks/{name}" for name in sorted(WEBHOOKS)]
    r = await client.get("/ready")
    assert r.status_code == 200, r.text  # told, not required: the other webhooks and calls still work
    assert r.json()["checks"]["webhooks"] == {"ok": False, "required": False, "unserved": {"ghost": "no_such_tool"}}
    r = await client.post("/agent/webhooks/ghost", content=b"{}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "TOOL_NOT_FOUND"


async def test_secrets_are_never_echoed_nor_logged(client: httpx.AsyncClient, api_settings: ApiSettings,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    answers = []
    with caplog.at_level(logging.DEBUG):
        for scheme in SCHEMES:
            body = delivery(scheme, "secret-less")
            for headers in (signed(scheme, body), signed(scheme, body, WRONG[scheme]), {}):
                r = await client.post(f"/agent/webhooks/{scheme}", content=body, headers=headers)
                answers.append(r.text + str(r.headers))
    assert any("WEBHOOK_UNAUTHORIZED" in a for a in answers) and any('"completed"' in a for a in answers)
    assert any(getattr(record, "carmy", {}).get("event") == "webhook" for record in caplog.records)
    said = "\n".join(answers) + caplog.text + repr(api_settings) + str(api_settings.webhooks)
    for secret in SECRETS:
        assert secret not in said


def test_the_settings_refuse_what_would_fail_later() -> None:
    def refused(webhooks: dict[str, Any], env: dict[str, str] | None = None) -> str:
        with pytest.raises(SettingsError) as caught:
            ApiSettings.from_env({"CARMY_WEBHOOKS": json.dumps(webhooks), **(env or {})})
        return str(caught.value)

    assert "'a'" in refused({"a": {"tool": "t"}})  # verify must be said, "none" too
    assert "NOPE" in refused({"a": {"tool": "t", "verify": {**GITHUB, "secret_env": "NOPE"}}})
    assert "unknown field" in refused({"a": {"tool": "t", "verify": "none", "secret": "inline"}})
    assert "'b'" in refused({"b": {"tool": "t", "verify": {"scheme": "md5", "secret_env": "S"}}}, {"S": "x"})
    assert "exactly one" in refused({"a": {"tool": "t", "verify": {"scheme": "hmac-sha256"}}})
    assert "whsec_" in refused({"a": {"tool": "t", "verify": {"scheme": "standard-webhooks", "secret_env": "S"}}},
                               {"S": "whsec_!!!"})
    assert "api-key" in refused({"a": {"tool": "t", "verify": "none", "auth": "api-key"}})
    assert "name" in refused({"a/b": {"tool": "t", "verify": "none"}})
    assert "secret file" in refused({"a": {"tool": "t", "verify": {**GITHUB, "secret_env": None,
                                                                    "secret_file": "/nonexistent/secret"}}})


def test_a_standard_tolerance_is_at_least_a_second_and_no_longer_than_event_ids_are_kept() -> None:
    """A negative one refused every delivery; one longer than the event ids' record let a
    delivery replayed after the record expired, and still within the tolerance, run again."""
    key = "whsec_" + base64.b64encode(b"k" * 24).decode()

    def hook(tolerance: int, mode: str = "call") -> dict[str, str]:
        verify = {"scheme": "standard-webhooks", "secret_env": "S", "tolerance_s": tolerance}
        return {"CARMY_WEBHOOKS": json.dumps({"a": {"tool": "t", "verify": verify, "event_id": "webhook-id",
                                                    "mode": mode}}), "S": key}

    for tolerance in (-5, 0):
        with pytest.raises(SettingsError, match="tolerance_s"):
            ApiSettings.from_env(hook(tolerance))
    with pytest.raises(SettingsError, match=r"tolerance_s \(86401\) is longer than .*CARMY_RETENTION, 86400 s"):
        ApiSettings.from_env(hook(86401))
    with pytest.raises(SettingsError, match="CARMY_JOBS_RETENTION, 3600 s"):
        ApiSettings.from_env({**hook(7200, "job"), "CARMY_JOBS_RETENTION": "3600"})
    assert ApiSettings.from_env(hook(86400)).webhooks["a"].config.verify.tolerance_s == 86400  # type: ignore[union-attr]
    assert ApiSettings.from_env({**hook(7200), "CARMY_RETENTION": "7200"}).webhooks["a"]


def test_a_secret_may_come_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text(GH_SECRET + "\n")
    webhooks = {"a": {"tool": "t", "verify": {"scheme": "hmac-sha256", "secret_file": str(tmp_path / "secret")}}}
    settings = ApiSettings.from_env({"CARMY_WEBHOOKS": json.dumps(webhooks)})
    secret = settings.webhooks["a"].secret
    assert secret is not None and secret.value == GH_SECRET.encode()
    assert ApiSettings.from_env({}).webhooks == {}

