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
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from carmy_worker import signatures
from carmy_worker.failures import Failures
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
AT_ONCE = 64  # callbacks one loop holds at once (under way, or waiting for their receiver), over every partition
PER_RECEIVER = 16  # deliveries under way at once to one receiver (``outbound.endpoint``)
# A receiver whose oldest delivery under way is older than this, with PER_RECEIVER under way, is
# slow (or hangs until the timeout): no more of its callbacks wait in this loop's memory, where
# they would hold the room of every other receiver's; each goes back to Redis, due again in
# LATER_MS, with no attempt counted.
SLOW_S = 1.0
LATER_MS = 5_000
FIRST_BACKOFF_MS = 1000
MAX_BACKOFF_MS = 3_600_000


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The Standard Webhooks signature of ``body`` (``carmy_worker.signatures``)."""
    return signatures.signature(signatures.key_of(secret), message_id, timestamp, body)


def signed_headers(secret: str, message_id: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    at = int(time.time()) if timestamp is None else timestamp
    return {"webhook-id": message_id, "webhook-timestamp": str(at),
            "webhook-signature": sign(secret, message_id, at, body)}


@dataclass
class _Receiver:
    """One receiver's share of the loop: its deliveries under way (each with when it began) and
    the callbacks waiting for one of them to end."""

    under_way: dict[asyncio.Task[None], float] = field(default_factory=dict)
    waiting: deque[tuple[str, JobState]] = field(default_factory=deque)

    def full(self) -> bool:
        return len(self.under_way) >= PER_RECEIVER

    def slow(self, now: float) -> bool:
        return self.full() and now - min(self.under_way.values()) > SLOW_S


class CallbackLoop:
    """Delivers due callbacks until cancelled; Redis errors are logged and retried.

    Deliveries run side by side, AT_ONCE at most, and a new one starts as soon as one ends, not
    once a whole batch has: a receiver that never answers holds PER_RECEIVER of them until the
    timeout, and the rest go on for everyone else. Callbacks due before others are taken first;
    those of a full receiver wait their turn in memory, or go back to Redis if it is slow, so
    that a thousand callbacks to a receiver that hangs do not stand before everyone else's.
    """

    def __init__(self, redis: Redis, settings: NotifySettings) -> None:
        self.settings = settings
        self._callbacks = Callbacks(redis)
        self._jobs = JobStore(redis)
        self._turn = 0  # the partition a pass looks in first
        self._reach = Reach("callback loop", log)
        self._failures = Failures("callback loop", log)
        self._receivers: dict[str, _Receiver] = {}  # those with callbacks under way or waiting
        self._tasks: set[asyncio.Task[None]] = set()  # everything started, for the end
        self._room = asyncio.Event()  # set when a callback taken has ended

    async def run(self) -> None:
        try:
            while True:
                try:
                    taken = await self.tick()
                    stop_if_cancelled()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    raise_if_cancelled(exc)
                    self._failures.failed(exc)
                    taken, pause = 0, 1.0
                else:
                    self._failures.worked()
                    pause = POLL_S
                if not taken:
                    self._room.clear()
                    with contextlib.suppress(TimeoutError):  # until a callback ends, or the pause
                        async with asyncio.timeout(pause):
                            await self._room.wait()
        finally:
            # Deliveries cut short are not recorded: their lease ends, and a loop tries them again.
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def tick(self) -> int:
        """One pass over every partition: the callbacks it took (started, waiting, put back)."""
        self._put_back_from_slow_receivers()
        room = AT_ONCE - sum(len(r.under_way) + len(r.waiting) for r in self._receivers.values())
        if room <= 0:
            return 0
        # The room over every partition, not a fixed share of it each: at 16 partitions a share
        # (2) held the callbacks of one partition to a tenth of the pace. Each partition is
        # offered what the ones before it left, starting one further each pass, so that a
        # partition with many due does not take the whole batch every time.
        job_ids: list[str] = []
        count = keys.partition_count()
        first, self._turn = self._turn % count, self._turn + 1
        for partition in ((first + i) % count for i in range(count)):
            if len(job_ids) >= room:
                break
            # A partition whose primary is down is left for a while (``store.reach``), not the pass.
            due = await self._reach.run(partition, functools.partial(self._callbacks.look, partition,
                                                                     at_most=room - len(job_ids)))
            if due is not None:
                job_ids += due.job_ids
        if not job_ids:
            return 0
        jobs = await self._jobs.read_many(job_ids)
        now = time.monotonic()
        for job_id, job in zip(job_ids, jobs, strict=True):
            notify = None if job is None else job.notify
            if job is None or notify is None or notify.state != "pending":
                # Its job is gone, or its callback is no longer pending: RECORD forgets or skips it.
                self._spawn(self._callbacks.record(job_id=job_id, message_id="", outcome="final", delay_ms=0,
                                                   attempt=b"", window_ms=0))
                continue
            name = outbound.endpoint(notify.url)
            receiver = self._receivers.setdefault(name, _Receiver())
            if not receiver.full():
                self._start(name, receiver, job_id, job)
            elif receiver.slow(now):
                self._spawn(self._callbacks.later(job_id, notify.message_id, LATER_MS))
            else:
                receiver.waiting.append((job_id, job))
        return len(job_ids)

    async def idle(self) -> None:
        """Waits until every callback taken has ended: delivered or not, and recorded, or put back."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _start(self, name: str, receiver: _Receiver, job_id: str, job: JobState) -> None:
        task = self._spawn(self._deliver(job_id, job))
        receiver.under_way[task] = time.monotonic()
        task.add_done_callback(functools.partial(self._ended, name, receiver))

    def _ended(self, name: str, receiver: _Receiver, task: asyncio.Task[None]) -> None:
        del receiver.under_way[task]
        if receiver.waiting and not task.cancelled():
            job_id, job = receiver.waiting.popleft()
            self._start(name, receiver, job_id, job)
        elif not receiver.under_way and not receiver.waiting:
            self._receivers.pop(name, None)
        self._room.set()

    def _put_back_from_slow_receivers(self) -> None:
        now = time.monotonic()
        for receiver in self._receivers.values():
            while receiver.waiting and receiver.slow(now):
                job_id, job = receiver.waiting.popleft()
                assert job.notify is not None  # only pending callbacks wait
                self._spawn(self._callbacks.later(job_id, job.notify.message_id, LATER_MS))

    def _spawn(self, work: Coroutine[Any, Any, object]) -> asyncio.Task[None]:
        task = asyncio.create_task(self._logged(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @staticmethod
    async def _logged(work: Coroutine[Any, Any, object]) -> None:
        try:
            await work
        except Exception as exc:  # its lease ends, and a loop takes it again
            raise_if_cancelled(exc)
            log.warning("callback loop: %s", exc)

    async def _deliver(self, job_id: str, job: JobState) -> None:
        notify = job.notify
        assert notify is not None  # only pending callbacks are delivered
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
