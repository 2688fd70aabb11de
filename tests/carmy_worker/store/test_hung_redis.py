"""A worker on a Redis that hangs (stopped: it accepts connections and takes in
what is written, but answers nothing, and nothing resets the connection): the wait, whose
connection has no reply timeout of its own, fails within its deadline rather than waiting for
the node to wake, and the next one, once Redis answers again, takes work as before; and its
other commands (here a janitor's sweep) fail after the client's reply timeout. Behind Sentinel,
the next connection goes to the promoted replica; on a cluster, the other partitions go on
(tests/cluster/test_jobs_on_cluster_outage.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
import redis
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from carmy_worker.runtime import queue
from carmy_worker.store import batch, jobs, keys, leases, scripts
from carmy_worker.store.durable import Durability
from carmy_worker.store.janitor import Janitor
from carmy_worker.store.leases import WAIT_GRACE_S, Leases
from carmy_worker.store.roster import Claims, SyncLiveness
from carmy_worker.store.scripts import Script
from carmy_worker.store.submit import Submit
from carmy_worker.store.verdicts import Verdicts
from carmy_worker.wire import ExecutionJob
from tests.cells import one_partition  # noqa: F401 (a fixture)
from tests.support import private_redis, wait_until

GROUP = "hung"

# One partition, whatever the session's count: these are one Redis's hang as a client of one
# partition meets it. Over several, each partition's failure is told and the others go on
# (``store.reach``) rather than raised: tests/cluster/test_jobs_on_cluster_outage.py.
pytestmark = pytest.mark.usefixtures("one_partition")


@pytest.mark.slow
async def test_a_wait_on_a_hung_redis_fails_on_its_deadline_and_the_next_takes_work_once_it_answers() -> None:
    queue = jobs.queue_name(GROUP, 0)
    with private_redis() as server:
        client = redis.asyncio.Redis.from_url(server.url)
        leases = Leases(client, "w-hung")
        try:
            assert await leases.wait_and_take(client, queue, timeout=0.1, most=1, lease_ms=60_000,
                                              look_ahead=10) == []  # its connection is made, and kept
            server.pause()
            started = time.monotonic()
            try:
                with pytest.raises(RedisConnectionError, match="hung or cut off"):
                    async with asyncio.timeout(0.1 + WAIT_GRACE_S + 5):  # the test's bound, not the wait's
                        await leases.wait_and_take(client, queue, timeout=0.1, most=1, lease_ms=60_000,
                                                   look_ahead=10)
                waited = time.monotonic() - started
            finally:
                server.resume()
            assert 0.1 + WAIT_GRACE_S - 0.05 <= waited < 0.1 + WAIT_GRACE_S + 2
            exec_id = keys.new_execution_id(0)
            submitted = await Submit(client, retention=600)(
                ExecutionJob(execution_id=exec_id, tool="t", arguments=b"{}"), group=GROUP, idempotent=True,
                workers_alive=True, max_pending=100, queue_wait_ms=60_000, admission_ms=60_000)
            assert submitted.kind == "new"
            taken = await leases.wait_and_take(client, queue, timeout=5, most=1, lease_ms=60_000, look_ahead=10)
            assert [lease.job_id for lease in taken] == [exec_id]
        finally:
            await client.aclose()


async def submitted(client: redis.asyncio.Redis, *, idempotent: bool) -> str:
    """A new execution of partition 0, queued for ``GROUP``."""
    exec_id = keys.new_execution_id(0)
    got = await Submit(client, retention=600)(
        ExecutionJob(execution_id=exec_id, tool="t", arguments=b"{}"), group=GROUP, idempotent=idempotent,
        workers_alive=True, max_pending=100, queue_wait_ms=60_000, admission_ms=60_000)
    assert got.kind == "new"
    return exec_id


async def test_a_lease_given_up_on_a_hung_redis_runs_as_it_wakes_and_is_handed_back_to_run_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A LEASE a worker sends outside its waits (``Leases.take``) is given up after its bound on a
    Redis that hangs, where it used to wait for Redis to wake. Redis took it in, and runs it as
    it wakes: a non-idempotent execution is then claimed by, and its job leased to, a worker that
    does not know it. Its heartbeats hand them back as for any LEASE whose reply was lost (two full
    beats: the stray reaped, its tool never began, so it is queued again; the orphaned lease
    released), and the next LEASE runs it: once, as attempt 2."""
    monkeypatch.setattr(leases, "TAKE_TIMEOUT_S", 0.5)
    queue = jobs.queue_name(GROUP, 0)
    with private_redis() as server:
        client = redis.asyncio.Redis.from_url(server.url)
        r = redis.Redis.from_url(server.url)
        given_up, other = Leases(client, "w-given-up"), Leases(client, "w-other")
        try:
            assert await given_up.take(queue, most=1, lease_ms=60_000, look_ahead=10) == []  # LEASE loaded
            exec_id = await submitted(client, idempotent=False)
            server.pause()
            started = time.monotonic()
            try:
                with pytest.raises(RedisConnectionError, match="no reply to LEASE"):
                    async with asyncio.timeout(30):  # the test's bound: it used to wait for Redis to wake
                        await given_up.take(queue, most=1, lease_ms=60_000, look_ahead=10)
                waited = time.monotonic() - started
            finally:
                server.resume()
            assert 0.5 - 0.05 <= waited < 0.5 + 5
            wait_until(lambda: r.sismember(keys.running("w-given-up", 0), exec_id), what="the LEASE run as Redis woke")
            assert r.hexists(keys.leases("w-given-up", 0), exec_id)
            assert await other.take(queue, most=1, lease_ms=60_000, look_ahead=10) == []  # held by that lease
            liveness = SyncLiveness(r, dead_after=3.0)
            first = liveness.heartbeat("w-given-up", claims=Claims())  # the worker holds nothing
            assert [s.execution_id for s in first.strays] == [exec_id]
            assert [o.job_id for o in first.orphans] == [exec_id]
            second = liveness.heartbeat("w-given-up", claims=Claims(release=first.orphans))
            assert second.strays == first.strays  # confirmed: the worker reaps it (Runtime.reap_stray)
            assert await Verdicts(client, retention=600).reap(exec_id, "t", worker_id="w-given-up",
                                                              why="never recorded", attempt=1) == "requeued"
            [lease] = await other.take(queue, most=1, lease_ms=60_000, look_ahead=10)
            assert lease.job_id == exec_id and lease.claim is not None
            assert (lease.claim.verdict, lease.claim.attempt) == ("run", 2)
        finally:
            r.close()
            await client.aclose()


async def test_the_workers_other_commands_give_up_on_a_hung_redis_after_their_reply_timeout() -> None:
    with private_redis() as server:
        client = queue.connect(server.url, reply_timeout=0.5)  # what serve() makes, with 5 s
        janitor = Janitor(client, retention=600, dead_after=3.0)
        try:
            await janitor.sweep()  # connected
            server.pause()
            try:
                with pytest.raises(RedisTimeoutError):
                    async with asyncio.timeout(5):  # the test's bound: it used to wait for Redis to wake
                        await janitor.sweep()
            finally:
                server.resume()
            await janitor.sweep()  # connects again
        finally:
            await client.aclose(close_connection_pool=True)


# Answers its argument (a call's own round trip, and nothing else).
ECHO = Script("TEST_HUNG_ECHO", "return ARGV[1]")


@pytest.mark.slow
async def test_a_call_that_waits_for_replicas_gives_up_on_a_hung_redis_and_the_next_is_answered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``CARMY_REDIS_WAIT_REPLICAS`` a worker's outcome goes out on its own with its
    ``WAIT`` (not in a batch), on a client without a reply timeout: on a Redis that hangs it fails
    once its bound has passed, as a lost connection would, where it used to wait for Redis to
    wake; the next call, once Redis answers, goes through."""
    monkeypatch.setattr(scripts, "DURABLE_STALL_S", 0.5)
    durability = Durability(replicas=1, timeout_ms=100)  # no replica here: each WAIT answers 0 after 100 ms
    with private_redis() as server:
        client = redis.asyncio.Redis.from_url(server.url)
        try:
            assert await scripts.run(client, ECHO, ["k"], ["a"], durability) == b"a"  # connected
            server.pause()
            started = time.monotonic()
            try:
                with pytest.raises(RedisConnectionError, match="hung or cut off"):
                    async with asyncio.timeout(30):  # the test's bound: it used to wait for Redis to wake
                        await scripts.run(client, ECHO, ["k"], ["b"], durability)
                waited = time.monotonic() - started
            finally:
                server.resume()
            assert 0.6 - 0.05 <= waited < 0.6 + 5
            assert await scripts.run(client, ECHO, ["k"], ["c"], durability) == b"c"
        finally:
            await client.aclose()


async def send_alone(client: redis.asyncio.Redis) -> None:
    """A batch's call sent on its own (``batch._one``: a script Redis lost, or a cluster's slot
    table not loaded yet), as the batch would; its error is its future's."""
    future = asyncio.get_running_loop().create_future()
    await batch._one(client, batch._Call(ECHO, ["k"], ["alone"], future))
    await future


async def unblock_a_wait(client: redis.asyncio.Redis) -> None:
    """``CLIENT UNBLOCK`` of a wait, as an idle worker ends its other partitions' waits."""
    await leases.unblock(client, jobs.queue_name(GROUP, 0), 1_000_000)


@pytest.mark.parametrize(("send", "bound", "told"), [
    (send_alone, (batch, "STALL_S"), "hung or cut off"),
    (unblock_a_wait, (leases, "UNBLOCK_TIMEOUT_S"), "no reply to CLIENT UNBLOCK"),
], ids=["a-call-sent-alone", "client-unblock"])
async def test_a_command_a_worker_sends_alone_gives_up_on_a_hung_redis_within_its_bound(
        send: Callable[[redis.asyncio.Redis], Awaitable[None]], bound: tuple[object, str], told: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's client has no reply timeout (its waits block): each command it sends on its
    own carries a bound of its own, and on a Redis that hangs fails once it has passed, as a lost
    connection would, rather than waiting for Redis to wake; the next one is answered."""
    monkeypatch.setattr(*bound, 0.5)
    with private_redis() as server:
        client = redis.asyncio.Redis.from_url(server.url)
        try:
            await send(client)  # connected
            server.pause()
            started = time.monotonic()
            try:
                with pytest.raises(RedisConnectionError, match=told):
                    async with asyncio.timeout(30):  # the test's bound: it used to wait for Redis to wake
                        await send(client)
                waited = time.monotonic() - started
            finally:
                server.resume()
            assert 0.5 - 0.05 <= waited < 0.5 + 5
            await send(client)
        finally:
            await client.aclose()
