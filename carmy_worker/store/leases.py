"""A worker's leases on the jobs of its queue: LEASE (take due jobs, read them, claim their
executions), FINISH (end a lease that SETTLE did not end), and the LEASE a slot sends behind its
SETTLE to take its next job (``Handoff``).

The jobs are arq's, in arq's layout (``store.jobs``), but nothing here imports arq: a lease is a
token in arq's in-progress key and in the worker's leases hash, so the janitor can hand back the
jobs of a dead worker, and a late FINISH of a lease that was taken away touches nothing.
``runtime.queue`` is the arq side: it runs what these calls hand it under arq's ``run_job``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any, cast

from msgspec import Struct
from redis._parsers.hiredis import NOT_ENOUGH_DATA
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError, RedisError

from carmy_worker.deadlines import Deadlines
from carmy_worker.store import jobs, keys, metrics
from carmy_worker.store.attempts import CLAIM_ONE, MAX_ATTEMPTS, Claim, ClaimVerdict
from carmy_worker.store.batch import FollowUp
from carmy_worker.store.checkout import buffered_reply
from carmy_worker.store.cluster import StoreCluster, held_connection
from carmy_worker.store.durable import Durability
from carmy_worker.store.hints import DueHints
from carmy_worker.store.lua import ACCEPTED_WORK
from carmy_worker.store.reach import Reach
from carmy_worker.store.scripts import Script, answered_within, bind, hung

log = logging.getLogger("carmy.queue")

# Takes up to ARGV[2] jobs in one round trip: the due ones at the head of the queue (by Redis's
# clock, like the scores SUBMIT writes) that no other worker has leased. arq polls with the
# worker's clock, then takes each job with WATCH/EXISTS/ZSCORE/MULTI/EXEC (four round trips
# each). The in-progress keys set here are arq's, holding a token unique to this lease, also
# listed in the worker's leases hash: the janitor puts back the jobs of a dead worker, and a late
# finish of a lease that was taken away touches nothing.
# Each job leased is also read (arq's job bytes, '' if gone), so run_job needs no round trip of
# its own (arq's count of its runs, in its retry key, is not kept: see _AnsweredPipeline); its
# score moves to the end of its lease, when it is due again unless finished, so that the scan for
# due jobs does not walk over leased ones (whoever ends a lease early without finishing the job
# puts the score back: FINISH, REAP, the janitor, a heartbeat); and, if it was there to read, its
# execution is claimed (store.attempts.CLAIM_ONE), so the worker needs no CLAIM round trip either.
# Then the wake list holds one token per job still due and unleased that it looked at
# (jobs.WAKE_FOR), unless ARGV[9] is '1': a LEASE sent with a SETTLE (Leases.hand_over) looks
# only a few jobs down the queue, and leaves the tokens as they are (one too many, at most, for
# the job it took: an idle worker woken for nothing looks further, and sets them right).
# Every key is of the queue's partition: the in-progress, job and execution keys of the jobs it
# pops are named from that partition's prefixes (ARGV[1], ARGV[6], ARGV[10]): a partition's queue
# only ever holds its own executions.
# Then it counts the jobs of the queue still due and unleased (leased ones were moved to their
# lease's end), for the worker's hints of where work is (store.hints.DueHints): the due jobs it
# read less those it leased, when the read was not cut short by its limit (it saw every due job);
# otherwise with ZCOUNT.
# Returns {id, score before, job, verdict ('' if not claimed), attempt, ms waited, id, ..., still due}.
# KEYS: queue, leases hash, wake list, running set, the queue's partition's queue-wait histogram and
#       queued set
# ARGV: in-progress key prefix, how many, lease ms, how far down the queue to look, token prefix,
#       job key prefix, worker_id, max attempts, '1' to leave the wake list alone, execution key
#       prefix
LEASE = Script("LEASE", ACCEPTED_WORK + CLAIM_ONE + jobs.WAKE_FOR + """
local look, now_s = tonumber(ARGV[4]), int(now)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_s, 'WITHSCORES', 'LIMIT', '0', ARGV[4])
local leased, want, lease_end, waiting = {}, tonumber(ARGV[2]) * 6, now + tonumber(ARGV[3]), 0
local lease_end_s = int(lease_end)
local wake = ARGV[9] ~= '1'
for i = 1, #due, 2 do
  local job = due[i]
  local token = ARGV[5] .. job
  if #leased >= want then
    if not wake then break end  -- nothing to count the tokens for
    -- due, and takeable by another worker (a job another lease holds is not counted: no
    -- worker must be woken for it, again and again, while it runs)
    if redis.call('EXISTS', ARGV[1] .. job) == 0 then waiting = waiting + 1 end
  elseif redis.call('SET', ARGV[1] .. job, token, 'NX', 'PX', ARGV[3]) then
    redis.call('HSET', KEYS[2], job, token)
    redis.call('ZADD', KEYS[1], lease_end_s, job)
    local bytes = redis.call('GET', ARGV[6] .. job) or ''
    local verdict, attempt, waited = '', 0, 0
    if bytes ~= '' then
      verdict, attempt, waited = claim(ARGV[10] .. job, job, ARGV[7], KEYS[4], tonumber(ARGV[8]), KEYS[5], KEYS[6])
    end
    for _, v in ipairs({job, due[i + 1], bytes, verdict, attempt, waited}) do table.insert(leased, v) end
  end
end
if wake then wake_for(KEYS[3], waiting) end
if #due < 2 * look and lease_end > now then
  table.insert(leased, #due / 2 - #leased / 6)
else
  table.insert(leased, redis.call('ZCOUNT', KEYS[1], '-inf', now_s))
end
return leased
""")

# arq's finish_job and finish_failed_job, for one lease: only while the in-progress key still
# holds this lease's token. Finished: the job is gone; otherwise (a retry, a shutdown) it stays
# queued at score ARGV[4] (LEASE moved it to the lease's end): due at once, and one idle worker
# woken, unless deferred. A lease the janitor took away finishes as a no-op, so a paused worker
# waking up late cannot delete the job another worker now runs. (SETTLE ends the lease of a
# job it settled itself: FINISH is for every other end.)
# KEYS: in-progress, job, retry, queue, leases hash, wake list
# ARGV: job id, token, finished ('1' or ''), score to queue it at again, '1' to wake a worker
FINISH = Script("FINISH", ACCEPTED_WORK + jobs.WAKE_ONE + jobs.END_LEASE + """
local finished = ARGV[3] == '1'
if not end_lease(KEYS[5], KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], finished) then return 0 end
if not finished then
  redis.call('ZADD', KEYS[4], 'XX', ARGV[4], ARGV[1])
  if ARGV[5] == '1' then wake_one(KEYS[6]) end
end
return 1
""")

# Finishing a lease is retried through a Redis outage this long: a lease left behind would hold
# its job back until the in-progress key expires (the longest tool timeout and then some).
FINISH_RETRY_S = 60.0

# A wait's replies come within its BLPOP's timeout, then LEASE's run (and the WAIT for replicas,
# when asked for). A node that has still not answered this long after is hung or cut off (a
# stopped process, a network partition without a reset): the wait's connection, which has no
# reply timeout of its own, is dropped and the wait fails as a lost connection would, so that a
# cluster's other partitions go on and one Redis is tried again (behind Sentinel, the promoted
# replica). Long enough for a busy Redis's worst pauses (a long script, an fsync); a LEASE the
# node runs when it wakes is handed back by the heartbeat, as any whose reply was lost.
WAIT_GRACE_S = 2.0
# How often the waits' deadlines are looked at: one fires up to this much late.
DEADLINE_TICK_S = 0.25
# How long an ``unblock`` waits for its node: one that does not answer is hung, and the wait it
# was to end is bounded by its own deadline (``WAIT_GRACE_S``).
UNBLOCK_TIMEOUT_S = 0.5

# A LEASE sent on its own (``Leases.take``: a freed slot's, or where a reply said work is due, from
# the worker's main loop) is given up after this long without a reply, connecting to the node
# included: the worker's client has no reply timeout, and one sent to a primary that hangs held the
# loop, and every partition's calls with it, until the node woke. A LEASE answers in well under a
# millisecond; the API gives its SUBMIT as long. One given up may have run: what it leased and
# claimed nobody here holds, and the heartbeat hands it back, as for any LEASE whose reply was lost.
TAKE_TIMEOUT_S = 1.0

# How far down the queue a LEASE sent with a SETTLE looks: past a job another worker's lease still
# holds, but not over the whole backlog (checking each job there is most of a full LEASE's cost).
HANDOFF_LOOK_AHEAD = 4


class _Cell(Struct, frozen=True):
    """What LEASE names in a queue's partition besides the queue: where its claims observe their
    wait and unlist the executions, and the prefixes of the keys of the jobs it pops."""

    partition: int
    queue_wait: str
    queued: str
    in_progress_prefix: str
    job_prefix: str
    execution_prefix: str


@functools.lru_cache(maxsize=256)  # a worker's queues are few, and LEASE names them on every call
def _cell(queue: str) -> _Cell:
    partition = keys.partition_of_key(queue)
    return _Cell(partition, metrics.histogram("queue_wait", partition), keys.queued(partition),
                 jobs.in_progress_key_prefix(partition), jobs.job_key_prefix(partition),
                 keys.execution_prefix(partition))


class Lease(Struct, frozen=True):
    job_id: str
    score: int  # the job's score when it was leased (LEASE then moved it to the lease's end)
    token: str
    job: bytes = b""  # arq's job, as LEASE read it (empty: gone)
    runs: int = 1  # what arq's run_job is told of the job's runs: the attempt claimed, at least 1
    claim: Claim | None = None  # its execution's claim, made with the lease (None: job gone)
    sent_at: float = 0.0  # when LEASE was sent (time.monotonic); it may run later, its worker stopped
    queue: str = ""  # the queue it was leased from (its execution's partition's)


class Leases:
    """LEASE and FINISH for one worker's jobs, on one client."""

    def __init__(self, redis: Redis, worker_id: str, *, durability: Durability | None = None) -> None:
        # It claims: a claim a failover loses resets the attempt count (store.durable).
        self._lease = bind(redis, LEASE, durability=durability, within=TAKE_TIMEOUT_S)
        self._finish = bind(redis, FINISH)
        self.worker_id = worker_id
        # Per partition: the worker's leases hash and running set there.
        self._held = [(keys.leases(worker_id, p), keys.running(worker_id, p)) for p in keys.partitions()]
        # Each call's tokens get a prefix of their own: a late end of an earlier lease of the same
        # job never matches a later one. A counter, from a random start (two objects of one
        # worker id, in tests, do not collide), not a random draw per call: a system call each.
        self._calls = itertools.count(secrets.randbits(48))
        # Where work was last seen due, from every LEASE's reply: where the next LEASE goes.
        self.hints = DueHints()
        # The partitions whose LEASEs failed lately (a cluster's primary down or hung): an idle
        # worker's wait on every partition leaves them out for a while (``store.wakeups``), and
        # a LEASE outside the waits goes only where the last call answered (``answering``).
        self.reach = Reach("worker", log)
        # The deadlines of its waits (``WAIT_GRACE_S``), on one timer rather than one each: a
        # timer per wait was a few µs of every call at one client.
        self._deadlines = Deadlines(tick=DEADLINE_TICK_S)
        # On one Redis (not a cluster), per queue: the connection its waits go out on, and its pool.
        self._waits: dict[str, tuple[Any, AbstractConnection]] = {}

    async def take(self, queue: str, *, most: int, lease_ms: int, look_ahead: int) -> list[Lease]:
        """Up to ``most`` due jobs of ``queue``, leased for ``lease_ms``, with their arq job read
        and their execution claimed by this worker; the wake list then holds one token per job
        still due. No reply within ``TAKE_TIMEOUT_S`` fails as a lost connection does. Over
        several partitions a LEASE that fails takes nothing and pauses its partition (``reach``):
        the others go on; over one, the error is raised."""
        taken = await self.reach.run(_cell(queue).partition,
                                     functools.partial(self._take, queue, most, lease_ms, look_ahead))
        return taken or []

    async def _take(self, queue: str, most: int, lease_ms: int, look_ahead: int) -> list[Lease]:
        keys_, args, prefix = self._call(queue, most, lease_ms, look_ahead)
        sent_at = time.monotonic()
        return self.read(await self._lease(keys=keys_, args=args), queue, prefix, sent_at)

    def answering(self, queue: str) -> bool:
        """Whether ``queue``'s partition answered the last LEASE sent there (or none failed): a
        LEASE outside the waits goes only to such a one, since it holds up the worker's loop
        until it is answered or given up. One that failed is tried again by the waits alone
        (side by side, each bounded: ``store.wakeups``), until one is answered there."""
        return not self.reach.any_down or self.reach.answers(_cell(queue).partition)

    def failed(self, queue: str, exc: BaseException) -> None:
        """A LEASE of ``queue`` sent outside ``take`` and the waits (a SETTLE's) failed: over
        several partitions, its partition is paused as ``take`` would."""
        if keys.partition_count() > 1 and isinstance(exc, RedisError | OSError):
            self.reach.failed(_cell(queue).partition, exc)

    async def wait_and_take(self, redis: Redis, queue: str, *, timeout: float, most: int, lease_ms: int,
                            look_ahead: int, blocked: Callable[[int], None] | None = None) -> list[Lease]:
        """Wait up to ``timeout`` s for a token on ``queue``'s wake list, then ``take``, in one
        round trip on a connection held meanwhile (on one Redis, the queue's own, kept from one wait
        to the next: ``_waiting_connection``; on a cluster, one of the slot's primary:
        ``held_connection``): ``BLPOP`` and LEASE
        go out together, and Redis runs LEASE as soon as ``BLPOP`` returns (a token popped, or the
        timeout: the fallback poll), so the job that woke the worker comes with the wake-up.
        With replicas to wait for, ``WAIT`` follows on the same connection only if LEASE claimed
        something: an idle poll has nothing to protect, and must not wait for absent replicas.

        ``blocked``: told the connection's client id before the wait, so that a ``CLIENT UNBLOCK``
        may end it early (LEASE then runs at once: ``store.wakeups``).

        No reply ``WAIT_GRACE_S`` after the timeout (the node is hung or cut off): the connection
        is dropped and Redis's ``ConnectionError`` raised."""
        keys_, args, prefix = self._call(queue, most, lease_ms, look_ahead)
        sent_at = time.monotonic()
        commands: list[tuple[Any, ...]] = [("BLPOP", jobs.wake_list(queue), timeout), LEASE.command(keys_, args)]
        if blocked is not None:
            commands.insert(0, ("CLIENT", "ID"))
        durability = self._lease.durability
        deadline = timeout + WAIT_GRACE_S + (durability.timeout_ms / 1000 if durability is not None else 0.0)
        if isinstance(redis, StoreCluster):
            async with held_connection(redis, queue) as conn:  # the queue's slot's: BLPOP's and LEASE's keys
                reply = await self._blpop_then_lease(conn, commands, blocked, deadline)
        else:
            conn = await self._waiting_connection(redis, queue)
            try:
                reply = await self._blpop_then_lease(conn, commands, blocked, deadline)
            except BaseException:
                await conn.disconnect()  # a reply may be left unread: the next wait connects again
                raise
        if reply is None:  # Redis did not know LEASE (it did not run): sent alone, once loaded
            return await self._take(queue, most, lease_ms, look_ahead)
        return self.read(reply, queue, prefix, sent_at)

    async def _waiting_connection(self, redis: Redis, queue: str) -> AbstractConnection:
        """The connection this worker waits on ``queue``'s wake list with, kept from one wait to
        the next (a pool's checkout and release, each wait, were most of the wait's own CPU):
        connected again, as the pool would, if it was closed or holds anything unread."""
        pool = redis.connection_pool
        kept = self._waits.get(queue)
        if kept is not None and kept[0] is pool:
            await pool.ensure_connection(kept[1])
            return kept[1]
        if kept is not None:  # another client's (tests): back to its pool
            await kept[0].release(kept[1])
        conn: AbstractConnection = await pool.get_connection()
        self._waits[queue] = (pool, conn)
        return conn

    async def _blpop_then_lease(self, conn: AbstractConnection, commands: list[tuple[Any, ...]],
                                blocked: Callable[[int], None] | None, deadline: float) -> list[Any] | None:
        """Write ``commands`` (``CLIENT ID`` if ``blocked``, ``BLPOP``, LEASE) on ``conn``, read
        their replies: LEASE's, or None if Redis did not know the script (it did not run).
        ``ConnectionError`` if they are not all read within ``deadline`` s, or up to
        ``DEADLINE_TICK_S`` later (the caller drops ``conn``: a reply may come later)."""
        task = self._deadlines.start(deadline)
        try:
            await conn.send_packed_command(conn.pack_commands(commands))
            if blocked is not None:
                blocked(int(await conn.read_response()))
            await conn.read_response()  # a token, or none after the timeout: LEASE ran either way
            reply: list[Any] | None = None
            got: Any = buffered_reply(conn)  # it came with the BLPOP's, as a rule
            if got is NOT_ENOUGH_DATA:
                with contextlib.suppress(NoScriptError):  # a new primary, or a flushed cache: it did not run
                    reply = await conn.read_response()
            elif isinstance(got, Exception):
                if not isinstance(got, NoScriptError):
                    raise got
            else:
                reply = got
            durability = self._lease.durability  # None when no replica is asked for
            if reply and len(reply) > 1 and durability is not None:  # it claimed: the claims must reach replicas
                await conn.send_command("WAIT", durability.replicas, durability.timeout_ms)
                durability.acknowledged(int(await conn.read_response()))
            return reply
        except asyncio.CancelledError:
            if self._deadlines.expired(task):
                raise hung("no reply to a wait", deadline) from None
            raise
        finally:
            self._deadlines.stop(task)

    def hand_over(self, *, lease_ms: int, look_ahead: int, wanted: Callable[[], str | None],
                  on_taken: Callable[[list[Lease]], None]) -> Handoff:
        """A LEASE of one due job, to go out right behind the SETTLE of the job a slot just ran
        (``Runtime.handle``'s ``then``), of the queue ``wanted()`` names then (None: no LEASE);
        ``on_taken`` gets what it took."""
        return Handoff(self, lease_ms, min(look_ahead, HANDOFF_LOOK_AHEAD), wanted, on_taken)

    def _call(self, queue: str, most: int, lease_ms: int, look_ahead: int,
              wake: bool = True) -> tuple[list[str], list[Any], str]:
        """LEASE's keys and arguments, and the prefix of this call's lease tokens (new each call);
        ``wake``: it sets the wake list's tokens right."""
        prefix = f"{self.worker_id}/{next(self._calls):x}/"
        cell = _cell(queue)
        leases, running = self._held[cell.partition]
        return ([queue, leases, jobs.wake_list(queue), running, cell.queue_wait, cell.queued],
                [cell.in_progress_prefix, most, lease_ms, look_ahead, prefix, cell.job_prefix,
                 self.worker_id, MAX_ATTEMPTS, "" if wake else "1", cell.execution_prefix],
                prefix)

    def read(self, reply: list[Any], queue: str, prefix: str, sent_at: float) -> list[Lease]:
        """The leases of a LEASE's ``reply``; what it says is still due in ``queue`` goes to ``hints``."""
        *rows, due = reply
        self.hints.seen(queue, int(due))
        leases = []
        for i in range(0, len(rows), 6):
            job_id, score, job, verdict, attempt, waited = rows[i:i + 6]
            job_id = job_id.decode()
            claim = Claim(cast("ClaimVerdict", verdict.decode()), int(attempt), int(waited)) if verdict else None
            leases.append(Lease(job_id, int(float(score)), prefix + job_id, job, max(1, int(attempt)), claim,
                                sent_at, queue))
        return leases

    async def finish(self, lease: Lease, *, finished: bool, delay_ms: int | None) -> bool:
        """End ``lease``, retried through an outage; False if it was not ours any more. Not
        finished: the job is due again ``delay_ms`` after its score (at once without one)."""
        job_id, queue = lease.job_id, lease.queue
        partition = _cell(queue).partition  # its job's too: a queue holds its own partition's jobs
        keys_ = [jobs.in_progress_key(job_id), jobs.job_key(job_id), jobs.retry_key(job_id), queue,
                 self._held[partition][0], jobs.wake_list(queue)]
        args = [job_id, lease.token, "1" if finished else "", lease.score + (delay_ms or 0),
                "1" if delay_ms is None else ""]
        deadline = time.monotonic() + FINISH_RETRY_S
        delay = 0.05
        while True:
            try:
                return bool(await self._finish(keys=keys_, args=args))
            except (RedisError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("cannot finish the lease of job %s yet (%s); retrying", job_id, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)


async def unblock(redis: Redis, queue: str, client_id: int) -> None:
    """End the blocking wait of connection ``client_id`` on ``queue``'s wake list, as its timeout
    would (``CLIENT UNBLOCK``). A client id is a node's own: the command goes where the wait was
    sent, to the node serving ``queue``'s slot (``held_connection``; on one Redis, any
    connection of ``redis``'s pool). A node that does not answer within ``UNBLOCK_TIMEOUT_S``
    raises ``ConnectionError``."""
    async with held_connection(redis, queue) as conn, answered_within(UNBLOCK_TIMEOUT_S, "no reply to CLIENT UNBLOCK"):
        await conn.send_command("CLIENT", "UNBLOCK", client_id)
        await conn.read_response()


class Handoff(FollowUp):
    """A LEASE to send with a SETTLE (``Leases.hand_over``), made as it goes out. What it took is
    handed to ``on_taken`` as soon as its reply is read, before anything else runs: from then on
    the worker holds those jobs (its heartbeat reports them)."""

    def __init__(self, leases: Leases, lease_ms: int, look_ahead: int,
                 wanted: Callable[[], str | None], on_taken: Callable[[list[Lease]], None]) -> None:
        super().__init__()
        self._leases = leases
        self._queue = ""  # the one it leases from, once made
        self._lease = (1, lease_ms, look_ahead)
        self._wanted = wanted
        self._on_taken = on_taken
        self._prefix = ""  # of its lease tokens, once made
        self._sent_at = 0.0  # time.monotonic() when it was made, just before it went out
        self._read = False

    def make(self) -> tuple[Script, list[Any], list[Any]] | None:
        queue = self._wanted()
        if queue is None:
            return None
        self._queue = queue
        keys_, args, self._prefix = self._leases._call(queue, *self._lease, wake=False)
        self._sent_at = time.monotonic()
        return LEASE, keys_, args

    def answered(self, reply: asyncio.Future[Any]) -> None:
        """Read the reply once: from its done callback, or earlier by whoever finds it done."""
        if self._read:
            return
        self._read = True
        if reply.cancelled():
            return
        if (exc := reply.exception()) is not None:
            # It may have run: the heartbeat finds a lease and a claim nobody holds, as for any
            # LEASE whose reply was lost, and hands them back.
            log.warning("the LEASE sent with a SETTLE failed (%s); the next job waits for the next look", exc)
            self._leases.failed(self._queue, exc)
            return
        self._on_taken(self._leases.read(reply.result(), self._queue, self._prefix, self._sent_at))


