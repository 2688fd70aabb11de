"""Jobs' callbacks through ``python -m api`` and real worker processes, to a real receiver on
127.0.0.1 (loopback allowed here: ``CARMY_NOTIFY_ALLOW_PRIVATE``): a finished job's view arrives
signed so that the ``standardwebhooks`` library verifies it; a receiver that fails is retried
with the same webhook-id until it answers 2xx, every attempt listed in the job's view; a redirect
is not followed; a worker killed while a callback is pending leaves it to the next worker, and a callback pending
when worker, API and Redis (AOF) are all killed is delivered once they are back. The
refusals of forbidden addresses are in ``test_callbacks_refused``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from carmy_worker.store.callbacks import LEASE_MS
from tests.callbacks import NOTIFY_ENV, SECRET, Receiver, receiver
from tests.conftest import private_stack
from tests.e2e.test_jobs_api import AS_ALICE, KEYS, Api, job_api, ms
from tests.support import Stack, wait_until

# A worker killed during an attempt leaves its lease (30 s) to run out before the next worker
# makes the attempt again.
LEASE_WAIT = LEASE_MS / 1000 + 30


@pytest.fixture(scope="module")
def hook() -> Iterator[Receiver]:
    with receiver() as r:
        yield r


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[Api]:
    with job_api(stack, NOTIFY_ENV) as a:
        yield a


def notified(api: Api, job_id: str, state: str = "delivered", timeout: float = 30) -> dict[str, Any]:
    """The job's view once its callback is in ``state``."""
    found: dict[str, Any] = wait_until(
        lambda: (j := api.get(job_id))["notify"]["state"] == state and j, timeout,
        what=f"job {job_id}'s callback {state}")  # type: ignore[assignment]
    return found


def test_a_succeeded_job_calls_back_signed(api: Api, hook: Receiver) -> None:
    job = api.create("stamp", "called-back", notify={"url": hook.url("/done")})
    assert job["notify"] == {"url": hook.url("/done"), "state": "waiting", "delivered": False, "deliveries": [],
                             "events": ["succeeded", "failed", "dead_lettered", "cancelled"]}
    done = notified(api, job["job_id"])
    [delivery] = hook.to("/done")
    payload = Webhook(SECRET).verify(delivery.body, delivery.headers)
    assert payload["job_id"] == job["job_id"] and payload["status"] == "succeeded"
    assert payload["result"]["data"]["name"] == "called-back"
    assert delivery.headers["webhook-id"] == f"msg_{job['job_id']}_succeeded_1"
    assert delivery.headers["content-type"] == "application/json"
    [attempt] = done["notify"]["deliveries"]
    assert attempt["status"] == 200 and "error" not in attempt and done["notify"]["delivered"] is True
    # Tampered, or signed with another secret: the library refuses it.
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(delivery.body.replace(b"succeeded", b"failed"), delivery.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY").verify(delivery.body, delivery.headers)


def test_only_the_events_asked_for_call_back(api: Api, hook: Receiver) -> None:
    quiet = api.create("refuse", "quiet", notify={"url": hook.url("/quiet"), "events": ["succeeded"]})
    told = api.create("refuse", "told", notify={"url": hook.url("/told"), "events": ["failed"]})
    assert api.finished(quiet["job_id"])["status"] == "failed"
    notified(api, told["job_id"])
    assert api.get(quiet["job_id"])["notify"]["state"] == "waiting"
    assert hook.to("/quiet") == []


def test_a_receiver_that_fails_gets_it_again_with_the_same_id(api: Api, hook: Receiver) -> None:
    hook.answer("/flaky", 500, 503)
    job = api.create("stamp", "retried-callback", notify={"url": hook.url("/flaky")})
    done = notified(api, job["job_id"])
    attempts = hook.to("/flaky")
    assert len(attempts) == 3
    assert len({a.headers["webhook-id"] for a in attempts}) == 1
    for a in attempts:  # each attempt signed afresh, each verifies
        Webhook(SECRET).verify(a.body, a.headers)
    assert [d["status"] for d in done["notify"]["deliveries"]] == [500, 503, 200]
    # Backoff: 1 s, then 2 s (each plus up to 10 %), between attempts.
    at = [ms(d["at"]) for d in done["notify"]["deliveries"]]
    assert at[1] - at[0] >= 950 and at[2] - at[1] >= 1950


def test_a_redirect_is_not_followed(api: Api, hook: Receiver) -> None:
    hook.answer("/moved", 302, 302)
    job = api.create("stamp", "redirected", notify={"url": hook.url("/moved")})
    done = notified(api, job["job_id"])
    assert hook.to("/redirected/moved") == []
    assert [(d["status"], d.get("error")) for d in done["notify"]["deliveries"]] == [
        (302, "a redirect, not followed"), (302, "a redirect, not followed"), (200, None)]


def test_a_cancelled_job_calls_back_and_purge_waits_for_it(api: Api, hook: Receiver) -> None:
    hook.answer("/cancelled", *[500] * 50)
    job = api.create("stamp", "cancelled-cb", delay_ms=60_000, notify={"url": hook.url("/cancelled")})
    r = api.client.delete(f"{api.base}/agent/jobs/{job['job_id']}", headers=AS_ALICE)
    assert r.json()["status"] == "cancelled"
    wait_until(lambda: hook.to("/cancelled"), what="the callback's first attempt")
    assert api.get(job["job_id"])["notify"]["state"] == "pending"
    ops = {"authorization": "Bearer ops-token-0123456789ab"}
    purge = api.client.post(f"{api.base}/agent/jobs/{job['job_id']}/purge", headers=ops)
    assert purge.status_code == 409 and purge.json()["error"]["details"]["notify"] == "pending"
    hook.answer("/cancelled")
    notified(api, job["job_id"])
    assert json.loads(hook.to("/cancelled")[-1].body)["status"] == "cancelled"
    assert api.client.post(f"{api.base}/agent/jobs/{job['job_id']}/purge", headers=ops).status_code == 204


def test_the_same_request_with_another_notify_is_another_job(api: Api, hook: Receiver) -> None:
    body = {"tool": "stamp", "arguments": {"name": "fp"}, "request_id": "fp", "notify": {"url": hook.url("/fp")}}
    first = api.client.post(api.base + "/agent/jobs", json=body, headers=AS_ALICE)
    again = api.client.post(api.base + "/agent/jobs", json=body, headers=AS_ALICE)
    other = api.client.post(api.base + "/agent/jobs", json={**body, "notify": {"url": hook.url("/fp2")}},
                            headers=AS_ALICE)
    assert (first.status_code, again.status_code, other.status_code) == (202, 200, 409)


@pytest.mark.parametrize(("notify", "field"), [
    ({"url": "ftp://127.0.0.1/x"}, "notify.url"),
    ({"url": "http://example.com/x"}, "notify.url"),
    ({"url": "http://127.0.0.1/" + "x" * 2048}, "notify.url"),
    ({"url": "http://user:pw@127.0.0.1/x"}, "notify.url"),
    ({"url": "http://127.0.0.1/x", "events": ["queued"]}, "notify.events"),
    ({"url": "http://127.0.0.1/x", "events": []}, "notify.events"),
])
def test_a_notify_it_cannot_honour_is_refused(api: Api, notify: dict[str, Any], field: str) -> None:
    r = api.client.post(api.base + "/agent/jobs", json={"tool": "stamp", "arguments": {"name": "no"},
                                                        "notify": notify}, headers=AS_ALICE)
    assert r.status_code == 400 and r.json()["error"]["code"] == "INVALID_REQUEST"
    assert r.json()["error"]["details"]["field"] == field
    if "example.com" in notify["url"]:
        assert "CARMY_NOTIFY_HOSTS" in r.json()["error"]["message"]


def test_a_callback_pending_when_its_worker_dies_is_delivered_by_the_next(api: Api, hook: Receiver,
                                                                         stack: Stack) -> None:
    hook.answer("/crash", *[500] * 100)
    job = api.create("stamp", "crash-cb", notify={"url": hook.url("/crash")})
    wait_until(lambda: len(hook.to("/crash")) >= 2, what="two failed attempts")
    [worker] = [p for p in stack.procs if p.kind == "worker" and p.alive()]
    worker.kill()
    assert api.get(job["job_id"])["notify"]["state"] == "pending"
    hook.answer("/crash")
    stack.worker("tests.toolsets.jobs", env=NOTIFY_ENV)
    done = notified(api, job["job_id"], timeout=LEASE_WAIT)
    ids = {d.headers["webhook-id"] for d in hook.to("/crash")}
    assert ids == {f"msg_{job['job_id']}_succeeded_1"}
    assert done["notify"]["deliveries"][-1]["status"] == 200


def test_a_pending_callback_survives_worker_api_and_redis_restarts(hook: Receiver) -> None:
    """Redis with AOF fsynced on every write: everything killed at once while a callback is
    pending, then started again; the callback arrives, under the same webhook-id."""
    hook.answer("/restart", *[500] * 100)
    with private_stack(durable=True, fsync="always") as (server, stack):
        worker = stack.worker("tests.toolsets.jobs", env=NOTIFY_ENV)
        api_proc, base = stack.api({"CARMY_API_KEYS": KEYS, **NOTIFY_ENV})
        with httpx.Client(timeout=30) as client:
            wait_until(lambda: "stamp" in client.get(base + "/agent/tools", headers=AS_ALICE).text)
            api = Api(base, stack.tmp, client)
            job = api.create("stamp", "restart-cb", notify={"url": hook.url("/restart")})
            wait_until(lambda: hook.to("/restart"), what="a failed attempt")
        worker.kill()
        api_proc.kill()
        server.kill()
        hook.answer("/restart")
        server.start()
        stack.worker("tests.toolsets.jobs", env=NOTIFY_ENV)
        _, base = stack.api({"CARMY_API_KEYS": KEYS, **NOTIFY_ENV})
        with httpx.Client(timeout=30) as client:
            done = notified(Api(base, stack.tmp, client), job["job_id"], timeout=LEASE_WAIT)
    assert done["notify"]["deliveries"][-1]["status"] == 200
    assert {d.headers["webhook-id"] for d in hook.to("/restart")} == {f"msg_{job['job_id']}_succeeded_1"}
    Webhook(SECRET).verify(hook.to("/restart")[-1].body, hook.to("/restart")[-1].headers)
