"""Webhook deliveries through real processes: ``python -m api`` with ``CARMY_WEBHOOKS`` and its
secrets in its environment, and a worker of ``tests.toolsets.jobs`` whose tools write each run to
a file (what really ran, counted outside Redis). For each scheme: signed, tampered, unsigned,
wrongly signed and redelivered; Standard Webhooks' stale timestamps; both modes; the refusals;
the API's log (the webhook whose tool no worker serves is told, no secret ever is); and an API
that cannot read a webhook's secret does not start."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from carmy_worker.store.jobstore import FINISHED
from tests.api.test_webhooks import (
    ENV,
    OPS_KEY,
    SCHEMES,
    SECRETS,
    SENDER_KEY,
    WEBHOOKS,
    WRONG,
    delivery,
    signed,
    standard,
    tamper,
)
from tests.support import Proc, Stack, StartError, wait_until

API_KEYS = json.dumps({SENDER_KEY: {"principal": "sender"},
                       OPS_KEY: {"principal": "ops", "permissions": ["carmy:operator"]}})


@dataclass
class Api:
    proc: Proc
    base: str
    stack: Stack
    client: httpx.Client

    def post(self, name: str, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.client.post(f"{self.base}/agent/webhooks/{name}", content=body, headers=headers or {})

    def runs(self, name: str) -> list[str]:
        """The request ids of ``stamp``'s runs for ``name``."""
        path = self.stack.tmp / f"stamp-{name}"
        return [line.split(" ", 1)[1] for line in path.read_text().splitlines()] if path.exists() else []

    def job(self, job_id: str) -> dict[str, Any]:
        r = self.client.get(f"{self.base}/agent/jobs/{job_id}", headers={"authorization": f"Bearer {OPS_KEY}"})
        view: dict[str, Any] = r.json()
        return view


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[Api]:
    stack.worker("tests.toolsets.jobs")
    proc, base = stack.api({"CARMY_WEBHOOKS": json.dumps(WEBHOOKS), "CARMY_API_KEYS": API_KEYS, **ENV})
    with httpx.Client(timeout=30) as client:
        wait_until(lambda: "stamp" in client.get(base + "/agent/tools",
                                                 headers={"authorization": f"Bearer {OPS_KEY}"}).text)
        yield Api(proc, base, stack, client)


def refused(r: httpx.Response) -> bool:
    return r.status_code == 401 and r.json()["error"]["code"] == "WEBHOOK_UNAUTHORIZED"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_delivery_runs_once_when_signed_and_never_otherwise(api: Api, scheme: str) -> None:
    name, event = f"e2e-{scheme}", f"evt-{uuid.uuid4()}"
    body = delivery(scheme, name, event)
    assert refused(api.post(scheme, tamper(body), signed(scheme, body, event=event)) if scheme != "shared"
                   else api.post(scheme, body, signed(scheme, body, WRONG[scheme] + "-tampered")))
    assert refused(api.post(scheme, body, {"content-type": "application/json"}))
    assert refused(api.post(scheme, body, signed(scheme, body, WRONG[scheme], event=event)))
    assert api.runs(name) == [] and api.runs("tampered-" + name) == []
    first = api.post(scheme, body, signed(scheme, body, event=event))
    assert first.status_code == 200 and first.json()["status"] == "completed", first.text
    assert first.json()["data"]["name"] == name
    again = api.post(scheme, body, signed(scheme, body, event=event))  # the sender's redelivery
    assert again.status_code == 200 and again.json() == first.json()
    assert api.runs(name) == [event]


def test_a_standard_webhooks_delivery_signed_too_long_ago_is_refused(api: Api) -> None:
    body = delivery("sw", "e2e-stale")
    assert refused(api.post("sw", body, standard(body, at=time.time() - 400)))
    assert api.runs("e2e-stale") == []


def test_job_mode_queues_the_delivery_and_a_redelivery_finds_the_same_job(api: Api) -> None:
    event = str(uuid.uuid4())
    body = delivery("gh", "e2e-job")
    r = api.post("gh-job", body, signed("gh", body, event=event))
    assert r.status_code == 202, r.text
    job = r.json()
    assert job == {"job_id": job["job_id"], "request_id": event}
    view: dict[str, Any] = wait_until(lambda: (v := api.job(job["job_id"]))["status"] in FINISHED and v,
                                      what="the job finished")  # type: ignore[assignment]
    assert view["status"] == "succeeded"
    again = api.post("gh-job", body, signed("gh", body, event=event))
    assert again.status_code == 200 and again.json() == job
    assert api.runs("e2e-job") == [event]


def test_unknown_names_and_bodies_not_json_are_refused(api: Api) -> None:
    r = api.post("nobody", b"{}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "WEBHOOK_NOT_FOUND"
    r = api.post("gh", b"<xml/>", signed("gh", b"<xml/>"))
    assert r.status_code == 400 and r.json()["error"]["code"] == "INVALID_REQUEST"
    r = api.post("gh", b"<xml/>", {"content-type": "application/json"})  # unverified: told so, not parsed
    assert refused(r)


def test_the_log_tells_the_unserved_webhook_and_never_a_secret(api: Api) -> None:
    for scheme in SCHEMES:  # deliveries good and bad, all logged
        body = delivery(scheme, "e2e-logged")
        api.post(scheme, body, signed(scheme, body))
        api.post(scheme, body, signed(scheme, body, WRONG[scheme]))
    wait_until(lambda: api.proc.output().count('"event": "webhook"') >= 6, what="the deliveries logged")
    log = api.proc.output()
    assert "ghost -> no_such_tool" in log
    for secret in SECRETS:
        assert secret not in log


def test_an_api_without_a_webhooks_secret_does_not_start(stack: Stack) -> None:
    env = {"CARMY_WEBHOOKS": json.dumps({"gh": WEBHOOKS["gh"]})}  # GH_SECRET not set
    with pytest.raises(StartError) as caught:
        stack.api(env)
    assert "CARMY_WEBHOOKS['gh']" in str(caught.value) and "GH_SECRET" in str(caught.value)
