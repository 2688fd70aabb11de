"""A worker's callback loop: it delivers the callbacks of finished jobs (docs/protocol.md,
"Callbacks"), at least once.

Each due callback (``store.callbacks``: made due by the script that finished its job, leased to
one loop per attempt) is POSTed as the job's view, signed the Standard Webhooks way with
``CARMY_NOTIFY_SECRET`` (``webhook-id`` the same on every attempt, ``webhook-timestamp``,
``webhook-signature``), through ``jobs.outbound`` (allowed hosts, no private addresses, no
redirects, a timeout). A 2xx answer delivers it; anything else is tried again after a backoff
(1 s doubling, capped at ``MAX_BACKOFF_MS``, jittered) until ``CARMY_NOTIFY_WINDOW`` has passed
since it became due; a refused address ends it at once, undeliverable. Every attempt is
recorded on the job, where its view shows it. A worker without a secret delivers nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from redis.asyncio import Redis

from carmy_worker import signatures
from carmy_worker.jobs import outbound
from carmy_worker.jobs.policy import backoff_ms
from carmy_worker.logs import info_line
from carmy_worker.settings import NotifySettings
from carmy_worker.store import keys
from carmy_worker.store.callbacks import Callbacks
from carmy_worker.store.jobstore import JobState, JobStore, rfc3339
from carmy_worker.store.pubsub import raise_if_cancelled, stop_if_cancelled
from carmy_worker.store.reach import Reach
from carmy_worker.wire import NotifyAttempt, json_encoder

log = logging.getLogger("carmy.jobs")

POLL_S = 0.2  # the longest the loop sleeps while nothing is due
AT_ONCE = 20  # callbacks delivered at once by one loop, over every partition
FIRST_BACKOFF_MS = 1000
MAX_BACKOFF_MS = 3_600_000


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The Standard Webhooks signature of ``body`` (``carmy_worker.signatures``)."""
    return signatures.signature(signatures.key_of(secret), message_id, timestamp, body)


def signed_headers(secret: str, message_id: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    at = int(time.time()) if timestamp is None else timestamp
    return {"webhook-id": message_id, "webhook-timestamp": str(at),
            "webhook-signature": sign(secret, message_id, at, body)}


class CallbackLoop:
    """Delivers due callbacks until cancelled; Redis errors are logged and retried."""

    def __init__(self, redis: Redis, settings: NotifySettings) -> None:
        self.settings = settings
        self._callbacks = Callbacks(redis)
        self._jobs = JobStore(redis)
        self._turn = 0  # the partition a pass looks in first
        self._reach = Reach("callback loop", log)

    async def run(self) -> None:
        while True:
            try:
                delivered = await self.tick()
                stop_if_cancelled()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise_if_cancelled(exc)
                log.warning("callback loop: %s", exc)
                delivered, pause = 0, 1.0
            else:
                pause = POLL_S
            if not delivered:
                await asyncio.sleep(pause)

    async def tick(self) -> int:
        """One pass over every partition: the attempts made."""
        # AT_ONCE over every partition, not a fixed share of it each: at 16 partitions a share
        # (2) held the callbacks of one partition to a tenth of the pace. Each partition is
        # offered what the ones before it left, starting one further each pass, so that a
        # partition with many due does not take the whole batch every time.
        job_ids: list[str] = []
        count = keys.partition_count()
        first, self._turn = self._turn % count, self._turn + 1
        for partition in ((first + i) % count for i in range(count)):
            if len(job_ids) >= AT_ONCE:
                break
            # A partition whose primary is down is left for a while (``store.reach``), not the pass.
            due = await self._reach.run(partition, functools.partial(self._callbacks.look, partition,
                                                                     at_most=AT_ONCE - len(job_ids)))
            if due is not None:
                job_ids += due.job_ids
        if not job_ids:
            return 0
        jobs = await self._jobs.read_many(job_ids)
        async with asyncio.TaskGroup() as group:
            for job_id, job in zip(job_ids, jobs, strict=True):
                group.create_task(self._deliver(job_id, job))
        return len(job_ids)

    async def _deliver(self, job_id: str, job: JobState | None) -> None:
        notify = None if job is None else job.notify
        if job is None or notify is None or notify.state != "pending":
            # Its job is gone, or its callback is no longer pending: RECORD forgets or skips it.
            await self._callbacks.record(job_id=job_id, message_id="", outcome="final", delay_ms=0, attempt=b"",
                                         window_ms=0)
            return
        body = json_encoder.encode(job.view())
        headers = signed_headers(self.settings.secret, notify.message_id, body)
        answer = await outbound.post(notify.url, body, headers, settings=self.settings)
        attempt = NotifyAttempt(at=rfc3339(int(time.time() * 1000)), status=answer.status, error=answer.error)
        outcome = "delivered" if answer.ok else "final" if answer.final else "retry"
        delay = backoff_ms(notify.tries + 1, base_ms=FIRST_BACKOFF_MS, cap_ms=MAX_BACKOFF_MS)
        state = await self._callbacks.record(
            job_id=job_id, message_id=notify.message_id, outcome=outcome, delay_ms=delay,
            attempt=json_encoder.encode(attempt), window_ms=self.settings.window * 1000)
        info_line(log, "callback", {
            "event": "callback", "job_id": job_id, "webhook_id": notify.message_id, "attempt": notify.tries + 1,
            "http_status": answer.status, "error": answer.error, "state": state,
            "retry_in_ms": delay if state == "pending" else None,
        })
