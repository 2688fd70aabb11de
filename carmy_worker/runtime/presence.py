"""A worker's presence in Redis: what it serves, that it is alive, and whether it still takes
work.

The heartbeat runs in its own thread with its own connection, so a tool that hogs the event
loop does not make a live worker look dead; a killed or paused process stops it at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import msgspec
import redis as sync_redis
from redis.asyncio import Redis

from carmy_worker.loop import running_loop
from carmy_worker.runtime.runner import Runtime
from carmy_worker.sdk.toolbox import Tool
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import keys
from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.roster import Beat, Claims, Holding, Liveness, Orphan, Stray, SyncLiveness
from carmy_worker.wire import WorkerInfo, WorkerTool, msgpack_encoder

log = logging.getLogger("carmy.worker")

RETRY_S = 0.2  # between heartbeats while Redis does not answer
VERIFY_EVERY_S = 0.5  # at most this often, ensure_fresh checks before a tool's step
CHECK_TIMEOUT_S = 1.0  # ensure_fresh's check waits this long for a node to answer (half to connect)
# One heartbeat in this many is a full check of everything the worker holds (store.roster); the
# others check only what was taken from it, which costs Redis nothing per execution held. A full
# one also goes first, after a beat that failed or met another Redis (a restart, a failover),
# after one that found strays or orphans (to confirm them), and when the runtime may have left a
# stray behind (``Runtime.unsure``).
FULL_EVERY = 10


def beat_timeout(dead_after: float) -> float:
    """Seconds the heartbeat thread waits for a node to connect or answer: a third of
    ``dead_after`` (1 s by default), and no less than half a second. When a primary hangs and its
    replica is promoted, that partition's janitor gives a worker one ``dead_after`` from its first
    look at the promoted replica (store.roster); the worker's first beat there waits out the one
    in flight on the hung node, then ``RETRY_S`` and a reload of the slot table: with a 2 s
    timeout it came up to 2.5 s after the promotion in ``bin/chaos --cluster`` runs."""
    return max(0.5, dead_after / 3)


def new_worker_id() -> str:
    """``host-pid-suffix``: unique per process start, and readable in logs and the console."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def pid_of(worker_id: str) -> int | None:
    """The process id in a worker id ``new_worker_id`` made (a host name may hold dashes);
    None for any other string."""
    parts = worker_id.rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def describe(tools: list[Tool], settings: WorkerSettings) -> list[WorkerTool]:
    return [
        WorkerTool(spec=t.spec, timeout=t.timeout or settings.default_timeout, title=t.title, retry=t.retry)
        for t in sorted(tools, key=lambda t: t.name)
    ]


def group_of(described: list[WorkerTool]) -> str:
    """Workers serving exactly the same tools share a queue: its name is their digest."""
    return hashlib.sha256(msgpack_encoder.encode(described)).hexdigest()[:16]


class Presence:
    """Registers a worker, keeps its heartbeat, and deregisters it on a clean stop.

    A worker is present in every partition (``store.roster``): each heartbeat beats in all of
    them at once (one pipeline; a full check of many executions, one per round of its parts),
    and so do its drain and its departure.

    Each heartbeat also checks what the worker's runtime holds. An execution the worker lost
    (the janitor reaped it while the worker was paused or cut off from Redis) is stopped at
    once; so is one whose tool lock went to another. Most beats learn of losses from the
    worker's set of them, in O(losses); one in ``FULL_EVERY``, and any after a sign that Redis
    may have lost a write or a reply, checks everything held (``store.roster``, HEARTBEAT).
    One listed as running on this worker that the runtime does not hold, on two full heartbeats
    in a row, is a stray (a reply that never came, or a write Redis lost): it is reaped like a
    dead worker's, so it never stays unsettled. A lease of a job the worker does not have, on
    two full heartbeats in a row (a LEASE whose reply never came), is released, so that job does
    not wait for its lease to expire.
    Between heartbeats, ``ensure_fresh`` covers a worker that was paused.
    """

    def __init__(self, *, redis: Redis, settings: WorkerSettings, info: WorkerInfo, runtime: Runtime,
                 connector: RedisConnector | None = None) -> None:
        self.redis = redis
        self.settings = settings
        self.connector = connector or RedisConnector(settings.redis_url, settings.redis_cluster_nodes)
        self.info = info
        self.runtime = runtime
        # The jobs this worker's queue loop has leased (set once it is built); safe from a thread.
        self.leased: Callable[[], Iterable[str]] = tuple
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._liveness = Liveness(redis, dead_after=settings.dead_after, group=info.group)
        # ensure_fresh's checks run in a thread of their own, one at a time, on a client of their
        # own (the heartbeat thread has its own), connected there at ``register``. A node that
        # hangs holds back the next step of every async tool, which must wait for the check's
        # answer, but not the event loop. The client's slot table is reloaded aside: the steps
        # need the check's answer, not the reload after it.
        client = self.connector.sync_client(socket_timeout=CHECK_TIMEOUT_S, socket_connect_timeout=CHECK_TIMEOUT_S / 2)
        self._checker = SyncLiveness(client, dead_after=settings.dead_after, reload_aside=True, group=info.group)
        self._check_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="carmy-check")
        self._checking: asyncio.Future[None] | None = None  # the check under way
        self.last_beat = time.monotonic()  # when the last heartbeat that got through was sent
        self.failing = False  # the last heartbeat did not get through
        self._verified = 0.0
        # A heartbeat sent this recently proves no janitor can have judged this worker dead.
        self._fresh_s = settings.dead_after / 2

    async def register(self) -> None:
        self._loop = asyncio.get_running_loop()
        # A beat first: the worker is in the roster before its info is written, so one killed
        # between the two leaves no info the janitor cannot find (it forgets both, an hour on);
        # and its group is marked in every partition (store.groups) before the info, from which
        # any other process learns the group, can route a call to its queues.
        await self._liveness.heartbeat(self.info.worker_id)
        await self._liveness.register(self.info.worker_id, msgpack_encoder.encode(self.info))
        await self.redis.publish(keys.CATALOG_CHANNEL, self.info.worker_id)
        self._thread = threading.Thread(target=self._beat, name="carmy-heartbeat", daemon=True)
        self._thread.start()
        self._check_thread.submit(self.connect_checks)

    def connect_checks(self) -> None:
        """Connect ``ensure_fresh``'s client, so that its first check (likely during a fault: a
        beat stale but not yet failed) does not first load a cluster's slot table, asking a hung
        seed first while every async tool waits. A failure is left to that check (it connects as
        it goes)."""
        try:
            self._checker.connect()
        except sync_redis.RedisError as exc:
            log.debug("ensure_fresh's client not connected ahead: %s", exc)

    def ensure_fresh(self) -> Awaitable[None] | None:
        """Before a tool's step, in the event loop: None if the step may be taken now. If the
        last heartbeat that got through started too long ago for this worker to be sure it was
        not judged dead (it was stopped, frozen or starved), a check goes out, in a thread, and
        the step waits for what this returns: a tool whose execution was given away does not take
        its next step. The loop runs on meanwhile. One check at a time: a step that asks while
        one is under way waits for that one (up to ``CHECK_TIMEOUT_S`` on a node that hangs). Not
        while Redis is known to be unreachable (nobody can reap anything then), and no sooner
        than ``VERIFY_EVERY_S`` after the last check ended."""
        checking = self._checking
        # One that has answered is over, though its waiters may not have woken yet: returned
        # again, the step would find it done, ask again, and never let the loop turn.
        if checking is None or checking.done():
            now = time.monotonic()
            if now - self.last_beat < self._fresh_s or self.failing or now - self._verified < VERIFY_EVERY_S:
                return None
            checking = self._checking = running_loop().run_in_executor(self._check_thread, self._check_now)
        # A wait of its own for each step: a tool stopped while it waits (a timeout, a cancel)
        # cancels its wait, not the check the others wait for.
        return asyncio.shield(checking)

    def _check_now(self) -> None:
        """``ensure_fresh``'s check, in its thread. What it finds lost is marked before it returns
        (``Runtime.lose``), so the step that waited for it is refused."""
        try:
            self._check(self._checker)
        except sync_redis.RedisError as exc:
            log.warning("could not check this worker's executions after a stale heartbeat: %s", exc)
        except Exception:  # the steps go on, as after a check Redis failed
            log.exception("could not check this worker's executions after a stale heartbeat")
        finally:
            # From its end: one that waited out its timeout on a node that hangs is not made
            # again at the next step (the heartbeat thread says soon that Redis fails).
            self._verified = time.monotonic()

    def _check(self, liveness: SyncLiveness, release: list[Orphan] | None = None) -> Beat:
        """One full heartbeat, and what it says about the executions held (``_heard``)."""
        started = time.monotonic()
        with self.runtime.watch_admits() as admitted:
            held = self.runtime.holdings()
            claims = Claims(held=held, jobs=list(self.leased()), release=release or [])
            beat = liveness.heartbeat(self.info.worker_id, claims=claims)
        if admitted:  # taken while the beat was out, so not in its snapshot: not strays, not orphans
            beat = msgspec.structs.replace(
                beat, strays=[s for s in beat.strays if s.execution_id not in admitted],
                orphans=[o for o in beat.orphans if o.job_id not in admitted])
        return self._heard(beat, started, _attempts(held))

    def _check_losses(self, liveness: SyncLiveness, epochs: list[str]) -> Beat:
        """One heartbeat that checks only what was taken from this worker since the last, exact
        while Redis is of ``epochs`` (``Beat.stale`` otherwise: nothing was checked). Nothing in
        it is per execution held: the executions it names are looked up one by one, and only
        attempts claimed before it was sent are judged by it."""
        started = time.monotonic()

        def attempt_of(exec_id: str) -> int | None:
            return self.runtime.attempt_of(exec_id, claimed_before=started)

        beat = liveness.check_losses(self.info.worker_id, epochs=epochs, locked=self.runtime.locked_holdings(),
                                     attempt_of=attempt_of)
        return self._heard(beat, started, attempt_of)

    def _heard(self, beat: Beat, started: float, attempt_of: Callable[[str], int | None]) -> Beat:
        """Lost executions, and ones whose lock went elsewhere, are marked (the tool sees it before
        its next step) and stopped: by the attempts held when the beat was sent (``attempt_of``),
        which a later attempt at the same execution is not; one whose run ended meanwhile (None)
        has nothing to stop."""
        for exec_id in beat.lost:
            if (attempt := attempt_of(exec_id)) is not None:
                self.runtime.lose(exec_id, attempt, "it was given to another attempt")
        for exec_id in beat.unlocked:
            if (attempt := attempt_of(exec_id)) is not None:
                self.runtime.unlock(exec_id, attempt)
        # Only now, and as of when it was sent: a reply read after a pause says nothing about
        # what happened during it.
        self.last_beat = max(self.last_beat, started)
        return beat

    def _beat(self) -> None:
        assert self._loop is not None
        loop = self._loop
        timeout = beat_timeout(self.settings.dead_after)
        client = self.connector.sync_client(socket_timeout=timeout, socket_connect_timeout=timeout)
        liveness = SyncLiveness(client, dead_after=self.settings.dead_after, group=self.info.group)
        suspects: set[Stray] = set()
        orphans: list[Orphan] = []
        epochs: list[str] = []  # each partition's Redis at the last full beat
        full_due, since_full = True, 0
        interval = self.settings.heartbeat
        while not self._stop.wait(interval):
            interval = self.settings.heartbeat
            try:
                if full_due or since_full >= FULL_EVERY - 1 or self.runtime.unsure:
                    self.runtime.unsure = False  # what goes wrong from here on, the next one finds
                    beat = self._check(liveness, release=orphans)
                    epochs, since_full = beat.epochs, 0
                    orphans = beat.orphans  # released by the next beat if they still are then
                    strays = set(beat.strays)
                    for stray in strays & suspects:
                        reaped = asyncio.run_coroutine_threadsafe(self.runtime.reap_stray(stray), loop)
                        reaped.add_done_callback(_log_failure)
                    suspects = strays - suspects
                    full_due = bool(suspects or orphans)  # confirmed, or not, by the next beat
                else:
                    beat = self._check_losses(liveness, epochs)
                    since_full += 1
                    full_due = beat.stale
                    if full_due:  # Redis restarted or failed over: what it lost, see at once
                        interval = 0
                if not beat.registered:
                    # Redis came back empty: say again who we are.
                    liveness.register(self.info.worker_id, msgpack_encoder.encode(self.info))
                    client.publish(keys.CATALOG_CHANNEL, self.info.worker_id)
                    log.info("registered again after Redis lost this worker")
                if self.failing:
                    log.info("heartbeat restored")
                self.failing = False
            except sync_redis.RedisError as exc:
                if not self.failing:
                    log.warning("heartbeat failed: %s", exc)
                self.failing = True
                full_due = True
                # Retry soon: once Redis is back, a live worker must say so before it is judged.
                interval = min(self.settings.heartbeat, RETRY_S)
            except Exception:  # a dead heartbeat thread would make a live worker look dead: go on
                log.exception("heartbeat failed unexpectedly; retrying")
                full_due = True
                interval = min(self.settings.heartbeat, RETRY_S)
        client.close()

    async def drain(self) -> None:
        """Stop being offered new work; keep heartbeating for what still runs."""
        await self._liveness.drain(self.info.worker_id)
        await self.redis.publish(keys.CATALOG_CHANNEL, self.info.worker_id)

    async def deregister(self) -> None:
        """Mark this worker departed (its tools are remembered a while, as unavailable)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        await self._liveness.depart(self.info.worker_id)
        await self.redis.publish(keys.CATALOG_CHANNEL, self.info.worker_id)
        self.close()

    def close(self) -> None:
        """Stop the check thread and close its client. ``deregister`` does this last; a
        ``Presence`` that never registered (in tests) is closed with this alone."""
        self._check_thread.shutdown(wait=False, cancel_futures=True)
        self._checker.redis.close()


def _log_failure(future: concurrent.futures.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("could not settle a stray execution", exc_info=future.exception())


def _attempts(held: list[Holding]) -> Callable[[str], int | None]:
    """The attempt ``held`` names for an execution, or None. Its index is built on the first
    question: a beat that lost nothing asks none, and the heartbeat thread, which holds the GIL
    while it builds one, need not build it over every execution held (the event loop waits)."""
    index: dict[str, int] | None = None

    def attempt_of(exec_id: str) -> int | None:
        nonlocal index
        if index is None:
            index = {h.execution_id: h.attempt for h in held}
        return index.get(exec_id)

    return attempt_of
