"""Callbacks: the Standard Webhooks signature (checked by the ``standardwebhooks`` library), and
RECORD against a real Redis: attempts kept, the window, a stale webhook-id, a job gone."""

from __future__ import annotations

import base64
import datetime

import pytest
import redis.asyncio
from standardwebhooks import Webhook, WebhookVerificationError

from carmy_worker.jobs.callbacks import sign, signed_headers
from carmy_worker.store import keys
from carmy_worker.store.callbacks import Callbacks
from carmy_worker.store.jobstore import JobStore
from tests.cells import cells  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("cells")
SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


def test_the_signature_is_the_standard_webhooks_one() -> None:
    body = b'{"job_id":"j","status":"succeeded"}'
    headers = signed_headers(SECRET, "msg_j_succeeded_1", body)
    assert Webhook(SECRET).verify(body, headers) == {"job_id": "j", "status": "succeeded"}
    # Known answer: HMAC-SHA256 of "{id}.{timestamp}.{body}" with the secret's bytes, in base64.
    expected = Webhook(SECRET).sign("msg_1", datetime.datetime.fromtimestamp(1700000000), "{}")
    assert sign(SECRET, "msg_1", 1700000000, b"{}") == expected
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body + b" ", headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body, {**headers, "webhook-id": "msg_other"})


async def pending(ar: redis.asyncio.Redis, job_id: str, message_id: str = "msg_a", since: int | None = None) -> None:
    now_s, now_us = await ar.time()
    await ar.hset(keys.job(job_id), mapping={
        "tool": "t", "status": "succeeded", "notify_url": "http://x/", "notify_events": "succeeded",
        "notify_state": "pending", "notify_id": message_id, "notify_tries": 0,
        "notify_since": now_s * 1000 + now_us // 1000 if since is None else since})
    await ar.zadd(keys.callbacks_due(keys.partition_of(job_id)), {job_id: 0})


async def looked(c: Callbacks) -> list[str]:
    """What one callback loop's pass takes, from every partition."""
    return [job_id for p in keys.partitions() for job_id in (await c.look(p)).job_ids]


def due(job_id: str) -> str:
    return keys.callbacks_due(keys.partition_of(job_id))


def job_id() -> str:
    """A job id in the last partition (drawn for it: the slot recorder keeps undirected ids out
    of partition 0 under its own count)."""
    return keys.new_job_id(keys.partition_count() - 1)


async def test_attempts_are_kept_the_latest_ten_and_a_2xx_ends_it(ar: redis.asyncio.Redis) -> None:
    c, j1 = Callbacks(ar), job_id()
    await pending(ar, j1)
    assert await looked(c) == [j1]
    assert await looked(c) == []  # leased to the first look
    for i in range(11):
        state = await c.record(job_id=j1, message_id="msg_a", outcome="retry", delay_ms=0,
                               attempt=f'{{"at":"t{i}","status":500}}'.encode(), window_ms=60_000)
        assert state == "pending"
    assert await c.record(job_id=j1, message_id="msg_a", outcome="delivered", delay_ms=0,
                          attempt=b'{"at":"t11","status":200}', window_ms=60_000) == "delivered"
    [job] = await JobStore(ar).read_many([j1])
    assert job is not None and job.notify is not None
    view = job.notify.view()
    assert view.state == "delivered" and view.delivered and job.notify.tries == 12
    assert [d.at for d in view.deliveries] == [f"t{i}" for i in range(2, 12)]
    assert await ar.zscore(due(j1), j1) is None


async def test_callbacks_due_in_every_partition_are_each_taken_once(ar: redis.asyncio.Redis) -> None:
    c = Callbacks(ar)
    job_ids = {keys.new_job_id(p) for p in keys.partitions() for _ in range(3)}
    for job_id in job_ids:
        await pending(ar, job_id)
    first, second = await looked(c), await looked(c)
    assert sorted(first) == sorted(job_ids) and second == []


async def test_past_its_window_or_refused_it_is_undeliverable(ar: redis.asyncio.Redis) -> None:
    c, old, refused = Callbacks(ar), job_id(), job_id()
    await pending(ar, old, since=0)
    await pending(ar, refused)
    assert await c.record(job_id=old, message_id="msg_a", outcome="retry", delay_ms=1000,
                          attempt=b'{"at":"t","error":"x"}', window_ms=60_000) == "undeliverable"
    assert await c.record(job_id=refused, message_id="msg_a", outcome="final", delay_ms=1000,
                          attempt=b'{"at":"t","error":"x"}', window_ms=60_000) == "undeliverable"
    assert await looked(c) == []
    assert sum([await ar.zcard(keys.callbacks_due(p)) for p in keys.partitions()]) == 0


async def test_a_stale_id_changes_nothing_and_a_gone_job_is_forgotten(ar: redis.asyncio.Redis) -> None:
    c, j, gone = Callbacks(ar), job_id(), job_id()
    await pending(ar, j, message_id="msg_new")
    assert await c.record(job_id=j, message_id="msg_old", outcome="delivered", delay_ms=0,
                          attempt=b'{"at":"t"}', window_ms=60_000) == "stale"
    assert await ar.hget(keys.job(j), "notify_state") == b"pending"
    await ar.zadd(due(gone), {gone: 0})
    assert await c.record(job_id=gone, message_id="", outcome="final", delay_ms=0, attempt=b"",
                          window_ms=0) == "gone"
    assert await ar.zscore(due(gone), gone) is None
