"""``/agent/jobs`` and ``/agent/schedules`` in process, against the real Redis: what is refused
when a job is created and how, idempotent creation, who sees which job, listing, cancelling a
queued job, the per-principal limit, and the metrics.

The catalog comes from a worker's info published by hand, heartbeating once (the module's
``dead_after`` outlives it): no job loop runs, so every job stays as the API left it.
(Jobs that run are tests/e2e/test_jobs_api.py's.)
"""

from __future__ import annotations

import asyncio
import datetime
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
import redis

from api.app import create_app
from api.settings import ApiKey, ApiSettings
from api.settings.quotas import Quotas
from carmy_worker.store import keys
from carmy_worker.store.jobstore import rfc3339
from carmy_worker.store.promotion import schedule_digest
from carmy_worker.store.quota import Quota
from carmy_worker.store.roster import SyncLiveness
from carmy_worker.wire import RetryPolicy, ScheduleSpec, WorkerInfo, WorkerTool, msgpack_encoder
from tests.conftest import asgi_client
from tests.support import Stack, app_settings
from tests.toolsets import basic

ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789ab"
DAVE, OPS = "dave-token-0123456789a", "ops-token-01234567890"
AS_ALICE = {"authorization": f"Bearer {ALICE}"}
AS_BOB = {"authorization": f"Bearer {BOB}"}
AS_DAVE = {"authorization": f"Bearer {DAVE}"}
AS_OPS = {"authorization": f"Bearer {OPS}"}
API_KEYS = {ALICE: ApiKey(principal="alice"), BOB: ApiKey(principal="bob"), DAVE: ApiKey(principal="dave"),
            OPS: ApiKey(principal="ops", permissions=frozenset({"carmy:operator"}))}
POLICY = RetryPolicy(max_attempts=4, backoff=0.5, max_backoff=10.0)
NIGHTLY = ScheduleSpec(name="nightly", cron="0 3 * * *", tool="echo", arguments=b'{"text":"night"}',
                       timezone="Europe/Lisbon", grace=30.0)
LATER = 3_600_000  # ms: a job due in an hour stays queued for the whole test
VIEW_FIELDS = {"job_id", "tool", "status", "request_id", "attempts", "max_attempts", "run_at", "created_at",
               "last_error", "result", "executions", "schedule", "notify"}


@pytest.fixture(scope="module")
def worker(stack: Stack) -> None:
    """Not a process: the info a worker of ``tests.toolsets.basic`` publishes, with a retry
    policy on every tool and one schedule, and one heartbeat."""
    tools = [WorkerTool(spec=t.spec, timeout=30.0, retry=POLICY) for t in basic.tools]
    info = WorkerInfo(worker_id="jobs-test-1", started_ms=int(time.time() * 1000), tools=tools, group="jobs-test",
                      schedules=[NIGHTLY])
    client = redis.Redis.from_url(stack.redis_url)
    liveness = SyncLiveness(client, dead_after=3600)
    liveness.register(info.worker_id, msgpack_encoder.encode(info))
    liveness.heartbeat(info.worker_id)
    client.close()


@pytest.fixture(scope="module")
def api_settings(stack: Stack) -> ApiSettings:
    return app_settings(stack.redis_url, api_keys=API_KEYS, dead_after=3600.0)


@pytest.fixture
def sync(stack: Stack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(stack.redis_url)
    yield client
    client.close()


def echo(text: str = "hi", **fields: object) -> dict[str, object]:
    return {"tool": "echo", "arguments": {"text": text}, "delay_ms": LATER, **fields}


async def create(client: httpx.AsyncClient, body: dict[str, object], headers: dict[str, str] = AS_ALICE
                 ) -> httpx.Response:
    return await client.post("/agent/jobs", json=body, headers=headers)


def refused(r: httpx.Response, status: int, code: str) -> dict[str, object]:
    """The error of a refusal answered with ``status`` and ``code`` in the envelope's form."""
    assert (r.status_code, r.headers["cache-control"]) == (status, "no-store"), r.text
    body = r.json()
    assert list(body) == ["error"] and body["error"]["code"] == code, body
    error: dict[str, object] = body["error"]
    return error


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of Prometheus text (its labels in any order), 0 if absent."""
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        sample, _, label_text = key.partition("{")
        if not line.startswith("#") and sample == name and dict(re.findall(r'(\w+)="([^"]*)"', label_text)) == labels:
            return float(value)
    return 0.0


def ms(rfc: str) -> int:
    return round(datetime.datetime.fromisoformat(rfc).timestamp() * 1000)


async def test_a_job_is_accepted_with_its_location_and_view(client: httpx.AsyncClient) -> None:
    before = int(time.time() * 1000)
    r = await create(client, echo(request_id="view-1"))
    assert r.status_code == 202, r.text
    job = r.json()
    assert set(job) == VIEW_FIELDS
    assert re.fullmatch(r"job_[0-9a-f-]{36}", job["job_id"])
    assert r.headers["location"] == f"/agent/jobs/{job['job_id']}"
    assert r.headers["cache-control"] == "no-store"
    assert {k: job[k] for k in ("tool", "status", "request_id", "attempts", "max_attempts", "last_error", "result",
                                "executions", "schedule")} == {
        "tool": "echo", "status": "queued", "request_id": "view-1", "attempts": 0,
        "max_attempts": POLICY.max_attempts, "last_error": None, "result": None, "executions": [], "schedule": None}
    created = ms(job["created_at"])
    assert before - 1000 <= created <= int(time.time() * 1000) + 1000
    assert ms(job["run_at"]) == created + LATER and job["run_at"].endswith("Z")

    got = await client.get(r.headers["location"], headers=AS_ALICE)
    assert (got.status_code, got.headers["cache-control"], got.json()) == (200, "no-store", job)


async def test_max_attempts_from_the_request(client: httpx.AsyncClient) -> None:
    r = await create(client, echo(max_attempts=7))
    assert (r.status_code, r.json()["max_attempts"]) == (202, 7)
    assert refused(await create(client, echo(max_attempts=0)), 400, "INVALID_REQUEST")["details"] == {
        "field": "max_attempts"}
    assert refused(await create(client, echo(max_attempts=101)), 400, "INVALID_REQUEST")["details"] == {
        "field": "max_attempts"}


async def test_run_at_with_an_offset_is_that_instant(client: httpx.AsyncClient) -> None:
    at = datetime.datetime.now(datetime.timezone(datetime.timedelta(hours=2))).replace(microsecond=250_000)
    at += datetime.timedelta(hours=1)
    body: dict[str, object] = {"tool": "echo", "arguments": {"text": "later"}, "run_at": at.isoformat()}
    r = await create(client, body)
    assert r.status_code == 202, r.text
    assert r.json()["run_at"] == rfc3339(round(at.timestamp() * 1000))  # the same instant, in UTC
    zulu = await create(client, {**body, "run_at": rfc3339(round(at.timestamp() * 1000))})
    assert (zulu.status_code, zulu.json()["run_at"]) == (202, r.json()["run_at"])


@pytest.mark.parametrize("when", [
    {"run_at": "2030-01-01T10:00:00"},  # no offset: which 10:00?
    {"run_at": "2030-01-01"},
    {"run_at": "tomorrow"},
    {"run_at": "2030-01-01T10:00:00Z", "delay_ms": 1000},  # both
    {"delay_ms": -1},
    {"run_at": "0001-01-01T00:00:00+14:00"},  # in year 0 in UTC
])
async def test_a_malformed_time_is_refused(client: httpx.AsyncClient, when: dict[str, object]) -> None:
    error = refused(await create(client, {"tool": "echo", "arguments": {"text": "x"}, **when}), 400,
                    "INVALID_REQUEST")
    assert error["details"] in ({"field": "run_at"}, {"field": "delay_ms"})


@pytest.mark.parametrize(("asked", "shown"), [
    # Past times, so that they fit any horizon: due at once, and once cancelled shown as asked.
    ("2020-01-01t10:00:00z", "2020-01-01T10:00:00.000Z"),  # RFC 3339 allows "t" and "z" in lower case
    ("2016-12-31T23:59:60Z", "2017-01-01T00:00:00.000Z"),  # a leap second: unix time counts the next
    ("2020-01-01T10:00:00.1234567890123456789Z", "2020-01-01T10:00:00.124Z"),  # any digits, never earlier
    ("2020-01-01T10:00:00+14:00", "2019-12-31T20:00:00.000Z"),
    ("2020-01-01T10:00:00-12:00", "2020-01-01T22:00:00.000Z"),
])
async def test_every_rfc_3339_form_is_read_as_its_instant(client: httpx.AsyncClient, asked: str, shown: str
                                                          ) -> None:
    r = await create(client, {"tool": "echo", "arguments": {"text": "x"}, "run_at": asked})
    assert r.status_code == 202, r.text
    cancelled = (await client.delete(r.headers["location"], headers=AS_ALICE)).json()
    assert cancelled["run_at"] == shown


@pytest.mark.parametrize("asked", [
    "20200101T100000Z",  # ISO 8601's basic format
    "2020-W01-2T10:00:00Z",  # a week date
    "2020-01-01T10Z", "2020-01-01T10:00Z",  # no seconds
    "2020-01-01T10:00:00+0100", "2020-01-01T10:00:00+01", "2020-01-01T10:00:00+01:00:30",
    "2020-01-01T10:00:00,5Z", "2020-01-01T10:00:00.Z", "2020-01-01T24:00:00Z", "2020-01-01T10:00:00+24:00",
])
async def test_iso_8601_forms_that_are_not_rfc_3339_are_refused(client: httpx.AsyncClient, asked: str) -> None:
    error = refused(await create(client, {"tool": "echo", "arguments": {"text": "x"}, "run_at": asked}), 400,
                    "INVALID_REQUEST")
    assert error["details"] == {"field": "run_at"}


async def test_a_time_long_past_is_due_at_once_and_shown_as_asked(client: httpx.AsyncClient) -> None:
    before = int(time.time() * 1000)
    r = await create(client, {"tool": "echo", "arguments": {"text": "x"}, "run_at": "0001-01-01T00:00:00Z"})
    assert r.status_code == 202, r.text
    assert before <= ms(r.json()["run_at"]) <= int(time.time() * 1000) + 1000  # queued: due now
    cancelled = (await client.delete(r.headers["location"], headers=AS_ALICE)).json()
    assert cancelled["run_at"] == "0001-01-01T00:00:00.000Z"  # otherwise: the time asked for, four digits to its year
    assert ms(cancelled["run_at"]) == ms("0001-01-01T00:00:00+00:00")


async def test_past_the_horizon_is_refused(client: httpx.AsyncClient, api_settings: ApiSettings) -> None:
    horizon_ms = api_settings.jobs_horizon * 1000
    far = rfc3339(int(time.time() * 1000) + horizon_ms + 60_000)
    # Far enough that Redis's Lua writes the distance with an exponent (past 1e14 ms), and past 64 bits.
    for when in ({"run_at": far}, {"delay_ms": horizon_ms + 60_000}, {"run_at": "9999-12-31T23:59:59Z"},
                 {"delay_ms": 2**70}):
        error = refused(await create(client, {"tool": "echo", "arguments": {"text": "x"}, **when}), 400,
                        "INVALID_REQUEST")
        assert error["details"] == {"field": next(iter(when)), "horizon_s": api_settings.jobs_horizon}
    # A millisecond past it: the message says a second more than the horizon, not the horizon itself.
    just_past = refused(await create(client, {"tool": "echo", "arguments": {"text": "x"}, "delay_ms": horizon_ms + 1}),
                        400, "INVALID_REQUEST")
    assert f"due {api_settings.jobs_horizon + 1} s from now" in just_past["message"]
    within = await create(client, {"tool": "echo", "arguments": {"text": "x"}, "delay_ms": horizon_ms - 60_000})
    assert within.status_code == 202


async def test_an_unknown_field_or_a_malformed_body_is_refused(client: httpx.AsyncClient) -> None:
    error = refused(await create(client, {**echo(), "priority": 1}), 400, "INVALID_REQUEST")
    assert "priority" in str(error["details"])
    refused(await client.post("/agent/jobs", content=b"{not json", headers={**AS_ALICE, "content-type":
                                                                             "application/json"}),
            400, "INVALID_REQUEST")
    refused(await create(client, {"arguments": {}}), 400, "INVALID_REQUEST")  # no tool
    refused(await client.post("/agent/jobs", content=b"tool=echo", headers={
        **AS_ALICE, "content-type": "application/x-www-form-urlencoded"}), 415, "UNSUPPORTED_MEDIA_TYPE")


async def test_a_body_over_the_limit_is_refused(client: httpx.AsyncClient, api_settings: ApiSettings) -> None:
    r = await create(client, echo("x" * api_settings.max_body))
    refused(r, 413, "PAYLOAD_TOO_LARGE")


async def test_the_checks_of_a_call_apply(client: httpx.AsyncClient) -> None:
    refused(await create(client, {"tool": "no_such_tool"}), 404, "TOOL_NOT_FOUND")
    refused(await create(client, {"tool": "wipe"}), 403, "CONFIRMATION_REQUIRED")
    error = refused(await create(client, {"tool": "echo", "arguments": {"text": 5}}), 400, "INVALID_ARGUMENTS")
    assert error["details"]["path"] == "$.text"  # type: ignore[index]
    refused(await create(client, {"tool": "echo", "arguments": {"text": "x"}, "request_id": ""}), 400, "INVALID_ID")
    # Nothing of those was queued.
    assert not [j for j in (await client.get("/agent/jobs?limit=1000", headers=AS_ALICE)).json()["jobs"]
                if j["tool"] in ("no_such_tool", "wipe") or j["request_id"] == ""]


async def test_the_same_request_id_and_body_is_the_same_job(client: httpx.AsyncClient) -> None:
    first = await create(client, echo("once", request_id="idem-1"))
    again = await create(client, echo("once", request_id="idem-1"))
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]
    other = await create(client, echo("twice", request_id="idem-1"))
    error = refused(other, 409, "IDEMPOTENCY_CONFLICT")
    assert error["details"] == {"job_id": first.json()["job_id"]}
    # Another principal's request id is its own.
    bobs = await create(client, echo("once", request_id="idem-1"), AS_BOB)
    assert bobs.status_code == 202 and bobs.json()["job_id"] != first.json()["job_id"]


async def test_a_job_is_its_creators(client: httpx.AsyncClient) -> None:
    job = (await create(client, echo("mine"))).json()
    url = f"/agent/jobs/{job['job_id']}"
    for method in ("GET", "DELETE"):
        refused(await client.request(method, url, headers=AS_BOB), 404, "JOB_NOT_FOUND")
    assert (await client.get(url, headers=AS_ALICE)).json()["status"] == "queued"  # bob's DELETE did nothing
    assert (await client.get(url, headers=AS_OPS)).json() == job  # an operator sees everyone's
    refused(await client.get(f"/agent/jobs/{keys.new_job_id()}", headers=AS_ALICE), 404, "JOB_NOT_FOUND")
    refused(await client.get("/agent/jobs/not-a-job-id", headers=AS_ALICE), 404, "JOB_NOT_FOUND")
    bobs = {j["job_id"] for j in (await client.get("/agent/jobs", headers=AS_BOB)).json()["jobs"]}
    assert job["job_id"] not in bobs


async def test_without_credentials_nothing_is_answered(client: httpx.AsyncClient) -> None:
    assert (await client.post("/agent/jobs", json=echo())).status_code == 401
    assert (await client.get("/agent/jobs")).status_code == 401
    assert (await client.get("/agent/schedules")).status_code == 401


async def test_the_list_is_newest_first_and_filters_by_status(client: httpx.AsyncClient) -> None:
    ids = []
    for i in range(3):
        r = await create(client, echo(f"list-{i}"), AS_DAVE)
        ids.append(r.json()["job_id"])
        wait_next_ms(r.json()["created_at"])  # newest first is by creation time: make them differ
    cancelled = await client.delete(f"/agent/jobs/{ids[1]}", headers=AS_DAVE)
    assert cancelled.status_code == 200

    r = await client.get("/agent/jobs", headers=AS_DAVE)
    assert (r.status_code, r.headers["cache-control"]) == (200, "no-store")
    assert [j["job_id"] for j in r.json()["jobs"]] == ids[::-1]
    assert [j["status"] for j in r.json()["jobs"]] == ["queued", "cancelled", "queued"]
    listed = await client.get("/agent/jobs", params={"status": "cancelled"}, headers=AS_DAVE)
    assert [j["job_id"] for j in listed.json()["jobs"]] == [ids[1]]
    listed = await client.get("/agent/jobs", params={"status": "queued"}, headers=AS_DAVE)
    assert [j["job_id"] for j in listed.json()["jobs"]] == [ids[2], ids[0]]
    listed = await client.get("/agent/jobs", params={"limit": "1"}, headers=AS_DAVE)
    assert [j["job_id"] for j in listed.json()["jobs"]] == [ids[2]]
    assert (await client.get("/agent/jobs", params={"status": "dead_lettered"}, headers=AS_DAVE)).json() == {
        "jobs": [], "next_cursor": None}
    # An operator's list is everyone's.
    everyone = {j["job_id"] for j in (await client.get("/agent/jobs", params={"limit": "1000"},
                                                        headers=AS_OPS)).json()["jobs"]}
    assert set(ids) <= everyone


async def test_an_operator_pages_through_everyones_jobs_once_each(client: httpx.AsyncClient) -> None:
    mine = {(await create(client, echo(f"page-{i}"), who)).json()["job_id"]
            for i, who in enumerate([AS_ALICE, AS_BOB, AS_DAVE] * 3)}
    seen: list[dict[str, Any]] = []
    params = {"limit": "2"}
    while True:
        r = await client.get("/agent/jobs", params=params, headers=AS_OPS)
        assert r.status_code == 200 and len(r.json()["jobs"]) <= 2
        seen += r.json()["jobs"]
        if r.json()["next_cursor"] is None:
            break
        params = {"limit": "2", "cursor": r.json()["next_cursor"]}
    ids = [j["job_id"] for j in seen]
    assert len(ids) == len(set(ids)) and mine <= set(ids)  # no job twice, none left out
    created = [j["created_at"] for j in seen]
    assert created == sorted(created, reverse=True)  # newest first across the pages
    refused(await client.get("/agent/jobs", params={"cursor": "yesterday"}, headers=AS_OPS), 400, "INVALID_REQUEST")
    # "²" is a digit to str.isdigit() and none to int(): a cursor's score is ASCII digits.
    superscript = f"\u00b2:{keys.new_job_id()}"
    refused(await client.get("/agent/jobs", params={"cursor": superscript}, headers=AS_OPS), 400, "INVALID_REQUEST")


def wait_next_ms(created_at: str) -> None:
    """Until the clock (Redis's is this machine's) is past ``created_at``: at most 2 ms."""
    while int(time.time() * 1000) <= ms(created_at) + 1:
        time.sleep(0.001)


@pytest.mark.parametrize(("params", "field"), [
    ({"status": "done"}, "status"), ({"limit": "0"}, "limit"), ({"limit": "1001"}, "limit"),
    ({"limit": "ten"}, None), ({"limit": "-1"}, None),
    # Digits to str.isdigit() that int() refuses (a 500) or reads (Arabic-Indic one): ASCII only.
    ({"limit": "\u00b2"}, None), ({"limit": "\u0661"}, None),
])
async def test_a_bad_status_or_limit_is_refused(client: httpx.AsyncClient, params: dict[str, str],
                                                field: str | None) -> None:
    error = refused(await client.get("/agent/jobs", params=params, headers=AS_ALICE), 400, "INVALID_REQUEST")
    if field is not None:
        assert error["details"] == {"field": field}


# Ids of nothing, fixed: each test process (-n) must collect the same names.
A_JOB, AN_EXECUTION = "job_00000000-0000-4000-8000-000000000405", "exec_00000000-0000-4000-8000-000000000405"


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("PUT", "/agent/jobs", {"GET", "HEAD", "POST"}),
    ("PATCH", f"/agent/jobs/{A_JOB}", {"GET", "HEAD", "DELETE"}),
    ("POST", f"/agent/executions/{AN_EXECUTION}", {"GET", "HEAD", "DELETE"}),
    ("GET", f"/agent/jobs/{A_JOB}/retry", {"POST"}),
])
async def test_a_method_not_allowed_names_every_method_of_its_path(client: httpx.AsyncClient, method: str,
                                                                    path: str, allow: set[str]) -> None:
    """RFC 9110's Allow lists what the path takes: not only the first of its routes' methods."""
    r = await client.request(method, path, headers=AS_ALICE)
    assert r.status_code == 405
    assert set(r.headers["allow"].split(", ")) == allow


async def test_only_an_operator_retries_and_only_a_failed_job(client: httpx.AsyncClient) -> None:
    job = (await create(client, echo("retry"))).json()
    url = f"/agent/jobs/{job['job_id']}/retry"
    refused(await client.post(url, headers=AS_ALICE), 403, "OPERATOR_REQUIRED")
    error = refused(await client.post(url, headers=AS_OPS), 409, "JOB_NOT_RETRYABLE")
    assert error["details"] == {"status": "queued"}
    refused(await client.post(f"/agent/jobs/{keys.new_job_id()}/retry", headers=AS_OPS), 404, "JOB_NOT_FOUND")
    assert (await client.get(f"/agent/jobs/{job['job_id']}", headers=AS_ALICE)).json() == job


async def test_a_queued_job_cancelled_never_becomes_due(client: httpx.AsyncClient, sync: redis.Redis) -> None:
    job = (await create(client, {"tool": "echo", "arguments": {"text": "cancel me"}})).json()  # due now
    assert sync.zscore(keys.job_due("echo", keys.partition_of(job["job_id"])), job["job_id"]) is not None
    url = f"/agent/jobs/{job['job_id']}"
    r = await client.delete(url, headers=AS_ALICE)
    assert (r.status_code, r.headers["cache-control"]) == (200, "no-store")
    assert r.json() == {**job, "status": "cancelled"}
    # No worker could promote it:
    assert sync.zscore(keys.job_due("echo", keys.partition_of(job["job_id"])), job["job_id"]) is None
    assert (await client.get(url, headers=AS_ALICE)).json()["status"] == "cancelled"
    again = await client.delete(url, headers=AS_ALICE)  # a finished job is left as it is
    assert (again.status_code, again.json()["status"]) == (200, "cancelled")
    refused(await client.post(url + "/retry", headers=AS_OPS), 409, "JOB_NOT_RETRYABLE")


async def test_the_limit_on_unfinished_jobs(stack: Stack, worker: None) -> None:
    # With a quota, carol's jobs are all in her home partition, where the limit is exact (without
    # one they spread, a share of it in each partition: test_jobstore's tests of the spread).
    settings = app_settings(stack.redis_url, api_keys={"carol-token-0123456789": ApiKey(principal="carol")},
                            dead_after=3600.0, jobs_max_open=2, quotas=Quotas(overrides={"carol": Quota(pending=100)}))
    as_carol = {"authorization": "Bearer carol-token-0123456789"}
    async with asgi_client(create_app(settings)) as client:
        first = await create(client, echo("1", request_id="c1"), as_carol)
        assert (first.status_code, (await create(client, echo("2"), as_carol)).status_code) == (202, 202)
        r = await create(client, echo("3"), as_carol)
        error = refused(r, 429, "RATE_LIMITED")
        assert error["details"] == {"limit": "jobs"}
        assert int(r.headers["retry-after"]) >= 1 and error["retry_after"] == int(r.headers["retry-after"])
        # A repeat of an accepted job is not a new one: answered, limit or not.
        repeat = await create(client, echo("1", request_id="c1"), as_carol)
        assert (repeat.status_code, repeat.json()) == (200, first.json())
        # Once one has finished, there is room again.
        assert (await client.delete(first.headers["location"], headers=as_carol)).json()["status"] == "cancelled"
        assert (await create(client, echo("3"), as_carol)).status_code == 202


async def test_discovery_advertises_jobs(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/.well-known/agent")).json()
    assert "jobs" in doc["capabilities"]
    assert doc["jobs_url"] == "/agent/jobs"


async def test_schedules_before_and_after_a_worker_took_them_up(client: httpx.AsyncClient, sync: redis.Redis
                                                                ) -> None:
    r = await client.get("/agent/schedules", headers=AS_ALICE)
    assert (r.status_code, r.headers["cache-control"]) == (200, "no-store")
    expected = {"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Lisbon", "tool": "echo",
                "grace_s": 30.0, "next_run_at": None, "last_job_id": None, "last_run_at": None, "skipped": 0,
                "fired": 0}
    assert r.json() == {"schedules": [expected]}
    next_ms, last_ms = int(time.time() * 1000) + 86_400_000, int(time.time() * 1000) - 1000
    job_id = keys.new_job_id()
    sync.hset(keys.schedule("nightly"), mapping={"spec": "d", "next": next_ms, "last_job": job_id,
                                                  "last_at": last_ms, "skipped": 2, "fired": 5})
    # A schedule no live worker declares any more is not listed, whatever state it left (that
    # state expires by itself: tests/carmy_worker/jobs/test_schedule_expiry.py).
    sync.hset(keys.schedule("retired"), mapping={"spec": "d", "next": next_ms, "fired": 3})
    r = await client.get("/agent/schedules", headers=AS_ALICE)
    assert r.json() == {"schedules": [{**expected, "next_run_at": rfc3339(next_ms), "last_job_id": job_id,
                                       "last_run_at": rfc3339(last_ms), "skipped": 2, "fired": 5}]}


async def test_a_schedule_only_dead_workers_declare_is_not_listed(stack: Stack, sync: redis.Redis) -> None:
    # A worker that stopped (or died) 10 s ago: its tool stays in the catalog for an hour (calls
    # get NO_WORKERS), but nobody fires its schedule any more.
    bygone = ScheduleSpec(name="bygone", cron="0 5 * * *", tool="bygone_echo", timezone="UTC", grace=5.0)
    spec = msgspec.structs.replace(next(t for t in basic.tools if t.name == "echo").spec, name="bygone_echo")
    info = WorkerInfo(worker_id="jobs-test-bygone", started_ms=int(time.time() * 1000) - 60_000,
                      tools=[WorkerTool(spec=spec, timeout=30.0)], group="jobs-test-bygone", schedules=[bygone])
    liveness = SyncLiveness(sync, dead_after=3)
    liveness.register(info.worker_id, msgpack_encoder.encode(info))
    liveness.heartbeat(info.worker_id, offset_ms=-10_000)
    try:
        async with asgi_client(create_app(app_settings(stack.redis_url, api_keys=API_KEYS, dead_after=3.0))) as client:
            deadline = time.monotonic() + 10
            while "bygone_echo" not in (await client.get("/agent/tools", headers=AS_ALICE)).text:
                assert time.monotonic() < deadline, "the dead worker's tool never reached the catalog"
                await asyncio.sleep(0.05)
            called = await client.post("/agent/execute", json={"tool": "bygone_echo", "arguments": {"text": "x"}},
                                       headers=AS_ALICE)
            assert (called.status_code, called.json()["error"]["code"]) == (503, "NO_WORKERS")
            listed = (await client.get("/agent/schedules", headers=AS_OPS)).json()["schedules"]
            assert "bygone" not in [s["name"] for s in listed]
    finally:  # the module's app (dead_after an hour) would list it
        for partition in keys.partitions():
            sync.zrem(keys.workers(partition), info.worker_id)
        sync.delete(keys.worker(info.worker_id))


async def test_schedules_say_the_definition_in_force_not_the_newest_workers(
        client: httpx.AsyncClient, sync: redis.Redis, stack: Stack) -> None:
    # A worker older than the module's defines "nightly" otherwise, and its definition is the one
    # the schedule fires by (the newer one's deploy rolled back): the list says what runs.
    older = ScheduleSpec(name="nightly", cron="0 4 * * *", tool="noop", timezone="UTC", grace=5.0)
    info = WorkerInfo(worker_id="jobs-test-0", started_ms=int(time.time() * 1000) - 60_000, tools=[],
                      group="jobs-test-old", schedules=[older])
    liveness = SyncLiveness(sync, dead_after=3600)
    liveness.register(info.worker_id, msgpack_encoder.encode(info))
    liveness.heartbeat(info.worker_id)
    next_ms = int(time.time() * 1000) + 3_600_000
    sync.hset(keys.schedule("nightly"), mapping={"spec": schedule_digest(older), "next": next_ms})

    async def listed() -> dict[str, Any]:
        return (await client.get("/agent/schedules", headers=AS_ALICE)).json()["schedules"][0]

    deadline = time.monotonic() + 10
    while (entry := await listed())["cron"] != "0 4 * * *" and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # the catalog's next refresh lists the older worker
    assert {k: entry[k] for k in ("cron", "timezone", "tool", "grace_s", "next_run_at")} == {
        "cron": "0 4 * * *", "timezone": "UTC", "tool": "noop", "grace_s": 5.0, "next_run_at": rfc3339(next_ms)}
    sync.hset(keys.schedule("nightly"), "spec", schedule_digest(NIGHTLY))  # the newest worker's in force again
    assert (await listed())["cron"] == NIGHTLY.cron


async def test_metrics_count_jobs_by_status(client: httpx.AsyncClient) -> None:
    def count(text: str, status: str) -> float:
        return metric(text, "carmy_jobs_total", tool="noop", status=status)

    before = (await client.get("/metrics", headers=AS_OPS)).text
    job = (await create(client, {"tool": "noop", "delay_ms": LATER})).json()
    await client.delete(f"/agent/jobs/{job['job_id']}", headers=AS_ALICE)
    after = (await client.get("/metrics", headers=AS_OPS)).text
    assert count(after, "queued") == count(before, "queued") + 1
    assert count(after, "cancelled") == count(before, "cancelled") + 1
    assert metric(after, "carmy_dead_letters") == 0 and "\ncarmy_dead_letters " in after
    assert "# TYPE carmy_job_lateness_seconds histogram" in after


@pytest.mark.slow
async def test_redis_out_of_reach_is_store_unavailable() -> None:
    async with asgi_client(create_app(app_settings())) as client:  # nothing listens at its Redis
        for method, url in (("GET", "/agent/jobs"), ("GET", f"/agent/jobs/{keys.new_job_id()}"),
                            ("DELETE", f"/agent/jobs/{keys.new_job_id()}")):
            r = await client.request(method, url)
            refused(r, 503, "STORE_UNAVAILABLE")
            assert r.headers["retry-after"] == "1"


async def test_only_an_operator_purges_and_only_a_finished_job(client: httpx.AsyncClient, sync: redis.Redis) -> None:
    job = (await create(client, echo("purge me", request_id="purge-1"))).json()
    url = f"/agent/jobs/{job['job_id']}"
    refused(await client.post(url + "/purge", headers=AS_ALICE), 403, "OPERATOR_REQUIRED")
    error = refused(await client.post(url + "/purge", headers=AS_OPS), 409, "JOB_NOT_FINISHED")
    assert error["details"] == {"status": "queued"}
    await client.delete(url, headers=AS_ALICE)  # cancelled: finished
    r = await client.post(url + "/purge", headers=AS_OPS)
    assert (r.status_code, r.content) == (204, b"")
    refused(await client.get(url, headers=AS_OPS), 404, "JOB_NOT_FOUND")
    assert job["job_id"] not in [j["job_id"] for j in (await client.get("/agent/jobs", headers=AS_OPS)).json()["jobs"]]
    assert not sync.exists(keys.job_idempotency("alice", None, "purge-1"))  # the request id is free again
    assert (await create(client, echo("purge me", request_id="purge-1"))).status_code == 202
