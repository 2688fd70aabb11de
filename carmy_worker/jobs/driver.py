"""A worker's job loop: it promotes the due jobs of the tools it serves to executions on its own
queue, concludes the attempts whose execution has a record, and fires the schedules it declares.

Every worker runs one; the scripts (``store.promotion``) make any number of them safe together:
a job is promoted once per attempt, an attempt concluded once, an occurrence fired once. The
loop never promotes more than its group's queues have room for (``room``, over all the
partitions: its group has a queue in each, and the room goes where the due jobs are), so that a
burst of due jobs waits in Redis as jobs, not as executions whose start deadline runs out. Each
pass looks in every partition (one LOOK each), so a due job in any of them is promoted in the
same pass.

A due job LOOK leased to this loop stays out of every loop's sight for ``DUE_LEASE_MS`` (10 s).
Had the PROMOTE after it failed (a primary failing over, a slot moving, a connection cut), the
job would have waited out that lease: a scheduled occurrence 10 s late for a fault that lasted
a moment. The loop keeps what it leased and could not promote (``_unpromoted``) and promotes it
on its next pass in that partition, ahead of what that pass finds due; PROMOTE checks each job
is still queued at the attempt it was built for, so sending one again is always safe. A LOOK
whose reply never came (the connection cut as Redis answered) leased its jobs all the same: the
loop's next LOOK there gets them again (it names the last LOOK whose reply it read, and Redis
keeps what the loop's last LOOK leased), while the lease that LOOK gave them lasts.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import secrets
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
from redis.asyncio import Redis
from redis.exceptions import RedisError

from carmy_worker.failures import Failures
from carmy_worker.jobs.cron import Cron, due
from carmy_worker.jobs.policy import Decision, decide
from carmy_worker.logs import info_line
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import jobs, keys, records
from carmy_worker.store.durable import Durability
from carmy_worker.store.jobstore import JobState, JobStore, job_fields, rfc3339
from carmy_worker.store.promotion import DUE_LEASE_MS, Look, Promotion, Promotions, schedule_digest
from carmy_worker.store.pubsub import raise_if_cancelled, stop_if_cancelled
from carmy_worker.store.reach import Reach
from carmy_worker.wire import (
    ExecutionJob,
    Record,
    ScheduleSpec,
    WorkerTool,
    job_decoder,
    msgpack_encoder,
)

log = logging.getLogger("carmy.jobs")

POLL_S = 0.1  # the longest the loop sleeps while no job is due sooner
# An execution of a job may wait this long in the queue before it is given up as never started
# (and its job tried again): the loop keeps the queue short (``room``), so only a queue that
# no worker drains comes near it.
START_WINDOW_S = 3600
ADMISSION_GRACE_S = 30  # as the API's: past the tool's timeout, how long an admission slot may stay held
LOST_AFTER_MS = 60_000  # an execution promoted this long ago whose hash and record are gone was lost
LOST_EVERY_S = 5.0
PROMOTE_AT_ONCE = 100  # jobs in one PROMOTE
FAR_BEHIND_MS = 3_600_000  # a schedule this far behind is caught up in a thread, off the event loop
RECHECK_MS = 1000  # how often a loop looks at a schedule another definition is late to fire


@dataclass
class _Schedule:
    spec: ScheduleSpec
    cron: Cron
    digest: str
    # How long its state is kept past the occurrence it waits for: its grace, then the worker's
    # CARMY_JOBS_RETENTION (store.promotion's SCHEDULE_KEEP), as long as its finished jobs are.
    kept_ms: int
    next_ms: int | None = None  # the occurrence it waits for, once known
    # While another definition is in force (a worker of another version or module), late for its
    # occurrence: not before this (Redis's ms) does the loop look whether it fired, or must be taken over.
    not_before: int = 0


class JobLoop:
    """The job loop of one worker, serving ``tools`` (as it publishes them) for its ``group``:
    an execution of a job goes on the group's queue in its job's partition."""

    def __init__(self, redis: Redis, *, tools: list[WorkerTool], group: str, settings: WorkerSettings,
                 schedules: Sequence[ScheduleSpec] = (), durability: Durability | None = None,
                 room: int | None = None) -> None:
        self.group = group
        self.settings = settings
        self.tools = {t.spec.name: t for t in tools}
        self._names = sorted(self.tools)
        self.room = room if room is not None else max(64, 4 * settings.concurrency)
        self._promotions = Promotions(redis, durability=durability)
        self._jobs = JobStore(redis)
        self._schedules = [_Schedule(s, Cron.parse(s.cron, s.timezone), schedule_digest(s),
                                     int(s.grace * 1000) + settings.jobs_retention * 1000) for s in schedules]
        self._lost_at = 0.0
        self._wake = asyncio.Event()
        self._turn = 0  # the partition a pass offers the room to first (``_look``)
        # partition → due jobs leased to this loop whose PROMOTE failed → when their lease ends (Redis's ms)
        self._unpromoted: dict[int, dict[tuple[str, str], int]] = {}
        self._now_ms = 0  # Redis's clock at the last pass's LOOK
        # Whose LOOKs these are, their count, and the number of the last one read in each
        # partition: a LOOK whose reply is lost hands its due jobs to the next (store.promotion).
        self._id = secrets.token_hex(8)
        self._looks = itertools.count(1)
        self._read: dict[int, int] = {}
        self._reach = Reach("job loop", log)
        self._failures = Failures("job loop", log)

    async def run(self) -> None:
        """Until cancelled; Redis errors are logged and retried."""
        while True:
            try:
                pause = await self.tick()
                stop_if_cancelled()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise_if_cancelled(exc)
                self._failures.failed(exc)
                pause = 1.0
            else:
                self._failures.worked()
            if pause > 0:
                await asyncio.sleep(pause)

    async def tick(self) -> float:
        """One pass over every partition it can reach (``store.reach``: on a Redis Cluster, one
        primary down delays only its own partitions); how long to wait before the next (0: there
        is more to do now)."""
        looks = await self._look()
        for partition, look in looks.items():
            self._now_ms = max(self._now_ms, look.now_ms)
            if due := self._due(partition, look):
                await self._reach.run(partition, functools.partial(self._promote, due, look.now_ms, partition))
        await self._conclude_settled({p: look.settled for p, look in looks.items() if look.settled})
        if time.monotonic() - self._lost_at > LOST_EVERY_S:
            self._lost_at = time.monotonic()
            await self._sweep()
        if not looks:  # no partition reached (their pauses not over yet)
            return self._reach.retry_after_s / 4
        now_ms = next(iter(looks.values())).now_ms
        soonest = await self._fire(now_ms)
        if any(look.due or look.settled for look in looks.values()):
            return 0.0
        wait = POLL_S
        for at, now in [(look.next_due_ms, look.now_ms) for look in looks.values()] + [(soonest, now_ms)]:
            if at is not None:
                wait = min(wait, max(0.0, (at - now) / 1000))
        return max(wait, 0.005)

    async def _look(self) -> dict[int, Look]:
        """LOOK in every partition it can reach (in partition order), the group's room shared
        out by demand.

        The room is the group's over all its queues, not a fixed share of it per partition: a
        share of ``room / N`` each would hold every partition to a sixteenth of it at 16
        partitions, and the due jobs of one partition (a principal's with a quota, all in its
        home partition) would be promoted at a sixteenth of the pace of one partition. So the
        partitions are looked in one after another while room is left, each offered all of it
        (less what its queue holds: LOOK counts that), starting one partition further each pass
        so that a flooded partition does not take the room of the others every time; once none
        is left, the rest are looked in together for what is settled and when they are next due.
        """
        if keys.partition_count() == 1:  # one queue: its LOOK counts what it holds against the room itself
            return {0: await self._look_in(0, room=self.room - self._kept())}
        held = await self._held()
        free = self.room - sum(held.values()) - self._kept()
        first, self._turn = self._turn % keys.partition_count(), self._turn + 1
        order = sorted(held, key=lambda p: (p - first) % keys.partition_count())
        found: dict[int, Look] = {}
        rest: list[int] = []
        for partition in order:
            if free <= 0:
                rest.append(partition)
                continue
            look = await self._reach.run(partition, functools.partial(
                self._look_in, partition, room=held[partition] + free))
            if look is not None:
                found[partition] = look
                free -= len(look.due)
        for partition, look in zip(rest, await asyncio.gather(*(
                self._reach.run(p, functools.partial(self._look_in, p, room=0))
                for p in rest)), strict=True):
            if look is not None:
                found[partition] = look
        return {p: found[p] for p in sorted(found)}

    async def _look_in(self, partition: int, *, room: int) -> Look:
        """One LOOK in ``partition``, its reply noted as read (``_read``)."""
        number = next(self._looks)
        look = await self._promotions.look(self._names, self.group, partition, room=room, loop_id=self._id,
                                           number=number, read=self._read.get(partition))
        self._read[partition] = number
        return look

    async def _held(self) -> dict[int, int]:
        """How many executions the group's queue holds in each partition it can reach: in one
        round trip while every partition answers; one call per partition once one did not (a
        cluster's pipeline fails as a whole when one of its primaries is down)."""
        if not self._reach.any_down:
            try:
                return dict(enumerate(await self._promotions.queued(self.group)))
            except (RedisError, OSError):
                pass  # which partition? ask each
        tried = self._reach.partitions()
        counts = await asyncio.gather(*(self._reach.run(p, functools.partial(self._promotions.queued_in, self.group, p))
                                        for p in tried))
        return {p: n for p, n in zip(tried, counts, strict=True) if n is not None}

    async def _sweep(self) -> None:
        """Conclude the attempts Redis lost, and forget expired jobs, in every partition it can reach."""
        for partition in keys.partitions():
            await self._reach.run(partition, functools.partial(self._sweep_one, partition))

    async def _sweep_one(self, partition: int) -> None:
        for exec_id, job_id in await self._promotions.lost(partition, older_than_ms=LOST_AFTER_MS):
            await self._conclude(await self._jobs.read(job_id), exec_id, None, began=True)
        await self._jobs.forget_expired(partition)

    # --- promotion ---------------------------------------------------------------------------

    def _kept(self) -> int:
        """How many leased due jobs wait for a PROMOTE to be sent again, their lease not over by
        the last pass's clock: they take room too (not those of a partition down past their lease)."""
        return sum(until_ms > self._now_ms for kept in self._unpromoted.values() for until_ms in kept.values())

    def _due(self, partition: int, look: Look) -> dict[tuple[str, str], int]:
        """What to promote in ``partition`` now, each with when its lease ends (Redis's ms): what
        an earlier PROMOTE there failed to, while its lease lasts (once it ends, any loop's LOOK
        finds those jobs again), then what ``look`` found due."""
        due = {job: until_ms for job, until_ms in self._unpromoted.pop(partition, {}).items() if until_ms > look.now_ms}
        if due:  # kept until a PROMOTE of them goes through
            self._unpromoted[partition] = dict(due)
        for job in look.due:
            due.setdefault(job, look.now_ms + DUE_LEASE_MS)
        return due

    async def _promote(self, due: dict[tuple[str, str], int], now_ms: int, partition: int) -> None:
        """Promote ``partition``'s ``due`` jobs to executions drawn into the same partition; if
        Redis fails under it, they are kept for the next pass (``_unpromoted``) until their
        lease ends."""
        try:
            await self._promote_now(list(due), now_ms, partition)
        except BaseException:
            # Those promoted before the failure are skipped next time (no longer queued).
            self._unpromoted[partition] = due
            raise
        self._unpromoted.pop(partition, None)

    async def _promote_now(self, due_jobs: list[tuple[str, str]], now_ms: int, partition: int) -> None:
        found = await self._promotions.due([job_id for _, job_id in due_jobs])
        by_tool: dict[str, list[Promotion]] = defaultdict(list)
        for (tool, job_id), due_job in zip(due_jobs, found, strict=True):
            if due_job.status != "queued" or due_job.payload is None:
                continue  # PROMOTE would skip it too
            try:
                template = job_decoder.decode(due_job.payload)
            except msgspec.DecodeError:
                log.error("job %s: its payload cannot be read; it stays queued", job_id)
                continue
            at = due_job.attempts
            exec_id = keys.new_execution_id(partition)
            base = due_job.request_id or job_id
            # Attempt n >= 2 has a request id of its own: the tool can tell attempts apart (its
            # own idempotency key for an external system), and each attempt is at most once.
            job = msgspec.structs.replace(template, execution_id=exec_id,
                                          request_id=base if at == 0 else f"{base}#{at + 1}")
            arq_job = jobs.encode_job(msgpack_encoder.encode(job), now_ms)
            by_tool[tool].append(Promotion(job_id, at, exec_id, arq_job, job.request_id or "", job.principal or ""))
        for tool, promotions in by_tool.items():
            served = self.tools[tool]
            for i in range(0, len(promotions), PROMOTE_AT_ONCE):
                done = await self._promotions.promote(
                    tool, promotions[i:i + PROMOTE_AT_ONCE], partition, group=self.group,
                    start_window_ms=START_WINDOW_S * 1000,
                    admission_ms=int((served.timeout + ADMISSION_GRACE_S) * 1000), retention=self.settings.retention,
                    effect=served.spec.effect)
                for job_id in done:
                    log.debug("job %s promoted", job_id)

    # --- conclusion --------------------------------------------------------------------------

    async def _conclude_settled(self, settled: dict[int, list[str]]) -> None:
        """Conclude what the LOOKs found settled, every partition's at once (one round trip of
        reads, one write of CONCLUDEs) while every partition answers; partition by partition
        once one did not, so that the others are concluded (a cluster's primary down)."""
        if not settled:
            return
        if not self._reach.any_down:
            try:
                await self._settled([exec_id for ids in settled.values() for exec_id in ids])
                return
            except (RedisError, OSError):
                if keys.partition_count() == 1:
                    raise
        await asyncio.gather(*(self._reach.run(p, functools.partial(self._settled, ids)) for p, ids in settled.items()))

    async def _settled(self, exec_ids: list[str]) -> None:
        """Conclude the attempts whose executions have their record, all at once: one round trip
        for their executions, one for their jobs, one write for their CONCLUDEs."""
        found = []
        for ended in await self._promotions.ended(exec_ids):
            if ended.job_id is None:  # its hash expired: nothing left to conclude with
                await self._promotions.forget_settled(ended.execution_id)
            else:
                found.append(ended)
        states = await self._jobs.read_many([e.job_id for e in found if e.job_id is not None])
        await asyncio.gather(*(self._conclude(job, e.execution_id, e.record, began=e.began, started_ms=e.started_ms)
                               for e, job in zip(found, states, strict=True)))

    async def _conclude(self, job: JobState | None, exec_id: str, record: Record | None, *, began: bool,
                        started_ms: int | None = None) -> None:
        if job is None:
            await self._promotions.forget_settled(exec_id)
            return
        if record is None:  # Redis lost the execution: nobody can say what it did
            record = records.uncertain(exec_id, job.tool, "the store lost track of it")
        decision = decide(record, job, began=began)
        status = await self._promotions.conclude(
            job_id=job.job_id, tool=job.tool, owner=job.owner, idem_key=job.idem_key, execution_id=exec_id,
            status=decision.status, delay_ms=decision.delay_ms, last_error=decision.last_error,
            result=decision.result, lateness_ms=None if started_ms is None else max(0, started_ms - _due(job)))
        if status:
            _log_attempt(job, exec_id, record, decision, status)

    # --- schedules ---------------------------------------------------------------------------

    async def _fire(self, now_ms: int) -> int | None:
        """Fire the schedules whose occurrence has come (each in its partition, if it can reach
        it); the soonest one they wait for."""
        soonest: int | None = None
        for s in self._schedules:
            await self._reach.run(keys.schedule_partition(s.spec.name), functools.partial(self._fire_if_due, s, now_ms))
            if s.next_ms is not None and (soonest is None or max(s.next_ms, s.not_before) < soonest):
                soonest = max(s.next_ms, s.not_before)
        return soonest

    async def _fire_if_due(self, s: _Schedule, now_ms: int) -> None:
        if s.next_ms is None:
            s.next_ms = await self._promotions.ensure_schedule(s.spec.name, s.digest, s.cron.next_after(now_ms),
                                                               kept_ms=s.kept_ms)
        if now_ms >= max(s.next_ms, s.not_before):
            await self._fire_one(s, now_ms)

    async def _fire_one(self, s: _Schedule, now_ms: int) -> None:
        assert s.next_ms is not None
        spec, tool = s.spec, self.tools.get(s.spec.tool)
        if tool is None:  # pragma: no cover - Toolbox.schedule checks the tool is in the same Toolbox
            return
        if now_ms - s.next_ms > FAR_BEHIND_MS:  # a long outage: counting what it skipped takes a while
            firing = await asyncio.to_thread(due, s.cron, s.next_ms, now_ms, int(spec.grace * 1000))
        else:
            firing = due(s.cron, s.next_ms, now_ms, int(spec.grace * 1000))
        occurrences, idempotency = [], []
        for at in firing.fire:
            request_id = f"schedule:{spec.name}@{rfc3339(at)}"
            payload = msgpack_encoder.encode(ExecutionJob(
                execution_id="", tool=spec.tool, arguments=spec.arguments, request_id=request_id,
                metadata={"schedule": spec.name, "occurrence": rfc3339(at)}))
            occurrences.append((keys.new_job_id(keys.schedule_partition(spec.name)), at, request_id, payload))
            idempotency.append(keys.schedule_idempotency(spec.name, request_id))
        shared = job_fields(tool=spec.tool, owner=keys.SCHEDULES_OWNER, payload=b"", policy=tool.retry,
                            max_attempts=tool.retry.max_attempts, idempotent=tool.spec.idempotent,
                            retention=self.settings.jobs_retention,
                            dead_retention=self.settings.dead_letter_retention, request_id=None)
        shared = shared[:-2]  # without the empty payload: each occurrence has its own
        fired = await self._promotions.fire(
            name=spec.name, digest=s.digest, tool=spec.tool, owner=keys.SCHEDULES_OWNER, waited_for=s.next_ms,
            next_ms=firing.next, kept_ms=s.kept_ms, skipped=firing.skipped, shared=shared, occurrences=occurrences,
            idempotency=idempotency)
        if fired.fired:
            s.next_ms = firing.next
            if firing.skipped:
                log.warning("schedule %s skipped %d occurrences missed by more than %g s", spec.name,
                            firing.skipped, spec.grace)
            for job_id in fired.job_ids:
                info_line(log, "job", {"event": "job", "job_id": job_id, "tool": spec.tool, "status": "queued",
                                       "schedule": spec.name})
        elif fired.next_ms is not None and fired.digest not in ("", s.digest):
            await self._defer(s, fired.next_ms, fired.digest, now_ms)
        else:
            s.next_ms = fired.next_ms  # None: its state is gone (Redis lost it): made again on the next pass

    async def _defer(self, s: _Schedule, next_ms: int, digest: str, now_ms: int) -> None:
        """Another definition of the schedule is in force (the newest worker's: a rolling deploy,
        or another module declaring the name): follow it while it fires. Once its occurrence is
        late past this schedule's grace, no worker of it is left (a deploy rolled back): take the
        schedule over, from its next occurrence, as a new definition would."""
        if now_ms - next_ms > s.spec.grace * 1000:
            first = s.cron.next_after(now_ms)
            s.next_ms = await self._promotions.ensure_schedule(s.spec.name, s.digest, first, kept_ms=s.kept_ms,
                                                               replacing=(digest, next_ms))
            if s.next_ms == first:
                log.warning("schedule %s: another definition of it went unfired for %g s; this worker's is "
                            "in force now", s.spec.name, (now_ms - next_ms) / 1000)
        else:
            s.next_ms = next_ms
        s.not_before = now_ms + RECHECK_MS if s.next_ms <= now_ms else 0


def _due(job: JobState) -> int:
    """When the attempt just concluded was due: the job's run_at for its first (it may have been
    queued later than that: asked for in the past, or a schedule's occurrence fired within its
    grace), when its retry was due for any other."""
    return job.run_at_ms if job.attempts == 1 else job.due_ms


def _log_attempt(job: JobState, exec_id: str, record: Record, decision: Decision, status: str) -> None:
    info_line(log, "job", {
        "event": "job", "job_id": job.job_id, "execution_id": exec_id, "tool": job.tool, "attempt": job.attempts,
        "outcome": record.status, "error_code": record.error_code, "status": status,
        "retry_in_ms": decision.delay_ms if status == "queued" else None,
    })
