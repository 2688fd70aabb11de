"""The job loop, the janitor and an idle worker's wait while one primary of a real Redis Cluster
is dead and not yet replaced: the work of the partitions whose primaries are up goes on at once,
and the dead primary's waits for it. They used to fail as a whole on the first refusal (every
LOOK of a pass, the pipelines that count the queues and scan for dead workers, every wait of a
round go to every primary), so one primary's failover held every partition's jobs, conclusions,
schedules, reaping and calls back until its replica was promoted. And a script run for the first
time on a live primary (PROMOTE here) is loaded there alone: redis-py's ``SCRIPT LOAD`` goes to
every primary, and failed on the dead one for all of them.

The cluster is the test's own, with a node timeout far longer than the test: the dead primary is
never failed over meanwhile."""

from __future__ import annotations

import asyncio

import pytest
from redis.crc import key_slot

from bench.localcluster import ClusterServer, LocalCluster
from carmy_worker.jobs.callbacks import CallbackLoop
from carmy_worker.jobs.driver import JobLoop
from carmy_worker.runtime import queue
from carmy_worker.settings import NotifySettings, WorkerSettings
from carmy_worker.store import jobs, keys, records
from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.durable import Durability
from carmy_worker.store.janitor import Janitor
from carmy_worker.store.jobstore import JobStore, job_fields
from carmy_worker.store.leases import Leases
from carmy_worker.store.promotion import Look
from carmy_worker.store.quota import Quota
from carmy_worker.store.roster import Liveness
from carmy_worker.store.scripts import Script, bind
from carmy_worker.store.submit import Submit
from carmy_worker.store.wakeups import wait_on_every_partition
from carmy_worker.wire import ExecutionJob, RetryPolicy, ScheduleSpec, msgpack_encoder
from tests.carmy_worker.jobs.test_callbacks import SECRET, pending
from tests.carmy_worker.jobs.test_driver import GROUP, TOOLS, Settler
from tests.carmy_worker.store.test_roster_cells import (
    DEAD_AFTER,
    RETENTION,
    accepted,
    claimed,
    error_code,
    watched_since_a_minute,
)
from tests.cells import partitions

pytestmark = pytest.mark.slow

def partition_owners(cluster: LocalCluster) -> tuple[dict[int, ClusterServer], ClusterServer, list[int]]:
    """Each partition's primary, the one the tests take down (partition 0's), and the partitions
    of the primaries that stay up."""
    owners = {p: cluster.owner(key_slot(keys.partition_prefix(p).encode())) for p in keys.partitions()}
    victim = owners[0]
    return owners, victim, [p for p in keys.partitions() if owners[p] is not victim]


async def make_job(store: JobStore, partition: int) -> str:
    """A job of the no-op ``mirror`` tool, due now, in ``partition``."""
    template = ExecutionJob(execution_id="", tool="mirror", arguments=b"{}")
    owner = keys.owner(None)
    fields = job_fields(tool="mirror", owner=owner, payload=msgpack_encoder.encode(template),
                        policy=RetryPolicy(backoff=0.05), max_attempts=3, idempotent=True, retention=60,
                        dead_retention=60, request_id=None)
    created = await store.create(job_id=keys.new_job_id(partition), tool="mirror", owner=owner, fields=fields,
                                 idempotency=None, fingerprint="", run_at_ms=None, delay_ms=0, horizon_ms=10_000,
                                 max_open=0, quota=Quota())
    assert created.kind == "new"
    return created.job_id


def test_a_dead_primary_holds_back_only_its_own_partitions_jobs(slow_to_fail_over: LocalCluster) -> None:
    cluster = slow_to_fail_over
    with partitions(16):
        owners, victim, up = partition_owners(cluster)
        down = [p for p in keys.partitions() if owners[p] is victim]
        assert up and down  # 16 partitions are spread over the three primaries

        async def scenario() -> dict[str, bytes | None]:
            client = RedisConnector("redis://localhost/0", tuple(cluster.nodes.split(","))).client(
                socket_timeout=2, socket_connect_timeout=2)
            store = JobStore(client)
            loop = JobLoop(client, tools=TOOLS, group=GROUP, settings=WorkerSettings())
            try:
                await loop.tick()  # the client knows the slots
                made = {await make_job(store, p): p for p in keys.partitions()}
                victim.kill()
                await loop.tick()  # one pass: the partitions of the dead primary fail, the others go on
                return {job_id: await client.hget(keys.job(job_id), "status") if made[job_id] in up else None
                        for job_id in made}
            finally:
                await client.aclose()

        statuses = asyncio.run(scenario())
    promoted = [job_id for job_id, status in statuses.items() if status is not None]
    assert len(promoted) == len(up)
    assert {statuses[job_id] for job_id in promoted} == {b"running"}, statuses


def test_attempts_settled_where_primaries_are_up_are_concluded_when_one_dies_mid_pass(
        slow_to_fail_over: LocalCluster) -> None:
    """Every partition's LOOK answered, then a primary died before the pass concluded what they
    found settled: the conclusions, read and written for every partition at once while all
    answer, fail on the dead primary, and are then made partition by partition, so that the
    jobs whose primaries are up are concluded in that same pass."""
    cluster = slow_to_fail_over
    with partitions(16):
        _, victim, up = partition_owners(cluster)

        async def scenario() -> dict[str, bytes | None]:
            client = RedisConnector("redis://localhost/0", tuple(cluster.nodes.split(","))).client(
                socket_timeout=2, socket_connect_timeout=2)
            store = JobStore(client)
            loop = JobLoop(client, tools=TOOLS, group=GROUP, settings=WorkerSettings())
            settler = Settler(client, lambda e: records.completed(e, "mirror", b'{"ok":true}', cacheable=False,
                                                                  duration_ms=1))
            try:
                made = {await make_job(store, p): p for p in keys.partitions()}
                await loop.tick()  # every job promoted
                await settler.settle_queued()
                assert len(settler.settled) == len(made)
                look = loop._look

                async def look_then_kill() -> dict[int, Look]:
                    found = await look()
                    assert sum(len(one.settled) for one in found.values()) == len(made)
                    victim.kill()
                    return found

                loop._look = look_then_kill  # type: ignore[method-assign]  # the fault, between the two
                await loop.tick()
                return {job_id: await client.hget(keys.job(job_id), "status") for job_id, p in made.items() if p in up}
            finally:
                await client.aclose()

        statuses = asyncio.run(scenario())
    assert len(statuses) == len(up)
    assert set(statuses.values()) == {b"succeeded"}, statuses


def test_a_hung_primary_holds_a_workers_job_pass_and_janitor_sweep_no_longer_than_its_reply_timeout(
        slow_to_fail_over: LocalCluster) -> None:
    """A primary that hangs (stopped: it answers nothing and resets nothing): the worker's client
    (``queue.connect``) gives up on its replies after ``reply_timeout``, so that the job loop's
    pass promotes the other partitions' jobs and the janitor's sweep ends, where both waited for
    the node to wake (for as long as a network partition without resets may last)."""
    cluster = slow_to_fail_over
    with partitions(16):
        _, victim, up = partition_owners(cluster)

        async def scenario() -> dict[str, bytes | None]:
            connector = RedisConnector("redis://localhost/0", tuple(cluster.nodes.split(",")))
            client = queue.connect(connector, reply_timeout=1.0)
            store = JobStore(client)
            loop = JobLoop(client, tools=TOOLS, group=GROUP, settings=WorkerSettings())
            try:
                await loop.tick()  # the client knows the slots
                made = {await make_job(store, p): p for p in keys.partitions()}
                victim.pause()
                try:
                    async with asyncio.timeout(15):  # each waited for the node to wake
                        await loop.tick()
                        await Janitor(client, retention=RETENTION, dead_after=DEAD_AFTER).sweep()
                finally:
                    victim.resume()
                return {job_id: await client.hget(keys.job(job_id), "status") for job_id, p in made.items() if p in up}
            finally:
                await client.aclose()

        statuses = asyncio.run(scenario())
    assert len(statuses) == len(up)
    assert set(statuses.values()) == {b"running"}, statuses


def test_the_janitor_reaps_in_the_partitions_of_the_primaries_still_up(slow_to_fail_over: LocalCluster) -> None:
    """A dead worker's executions are reaped where their primary is up, while another primary
    is down: the janitor's scan of every partition is one pipeline, which a cluster fails as a
    whole when one primary is down, and it is then made one partition at a time."""
    cluster = slow_to_fail_over
    with partitions(16):
        _, victim, up = partition_owners(cluster)
        connector = RedisConnector("redis://localhost/0", tuple(cluster.nodes.split(",")))
        r = connector.sync_client(socket_timeout=2, socket_connect_timeout=2)

        async def scenario() -> tuple[dict[int, str], int]:
            client = connector.client(socket_timeout=2, socket_connect_timeout=2)
            try:
                held = {p: claimed(r, await accepted(client, p, idempotent=False), "dead").execution_id
                        for p in keys.partitions()}
                await Liveness(client, dead_after=DEAD_AFTER).heartbeat("dead", offset_ms=-10_000)
                watched_since_a_minute(r)
                victim.kill()
                return held, await Janitor(client, retention=RETENTION, dead_after=DEAD_AFTER).sweep()
            finally:
                await client.aclose()

        held, reaped = asyncio.run(scenario())
        assert reaped == len(up)
        assert [error_code(r, held[p]) for p in up] == ["EXECUTION_UNCERTAIN"] * len(up)
        r.close()


@pytest.mark.parametrize("fault", ["killed", "hung"])
def test_an_idle_worker_takes_work_of_the_primaries_still_up(slow_to_fail_over: LocalCluster, fault: str) -> None:
    """An idle worker waits on every partition's wake list at once: a wait on the dead primary
    fails at once, and the round goes on with the others (and leaves that partition out of the
    next rounds for a second), so a call in a partition that is up is taken within milliseconds.
    The round used to fail as a whole, again and again, until the replica was promoted.

    A primary that hangs (stopped: it accepts connections and answers nothing) rather than
    refusing: the wait on it, whose connection has no reply timeout, used to hold every round of
    an idle worker until the node woke, so that no partition's call was taken. Now a round that
    another partition ended gives the hung wait up (``wakeups.ENDED_WITHIN_S``), and an idle one
    ends on the hung wait's own deadline (``leases.WAIT_GRACE_S``)."""
    cluster = slow_to_fail_over
    with partitions(16):
        _, victim, up = partition_owners(cluster)
        queues = [jobs.queue_name(GROUP, p) for p in keys.partitions()]

        async def scenario() -> tuple[list[str], list[str], str]:
            redis = RedisConnector("redis://localhost/0", tuple(cluster.nodes.split(","))).client(
                socket_timeout=None, socket_connect_timeout=2)  # a worker's waits: no reply timeout
            leases = Leases(redis, "w-outage")
            try:
                await redis.ping()  # the client knows the slots
                if fault == "killed":
                    victim.kill()
                else:
                    victim.pause()
                async with asyncio.timeout(10):  # a hung node's waits used to hold it until it woke
                    first = await wait_on_every_partition(leases, redis, queues, timeout=0.2, free=4,
                                                          lease_ms=60_000, look_ahead=10)  # nothing queued
                exec_id = keys.new_execution_id(up[0])  # the first partition tried: a free slot is its share
                round_ = asyncio.create_task(wait_on_every_partition(
                    leases, redis, queues, timeout=30, free=4, lease_ms=60_000, look_ahead=10))
                await Submit(redis, retention=600)(
                    ExecutionJob(execution_id=exec_id, tool="t", arguments=b"{}"), group=GROUP, idempotent=True,
                    workers_alive=True, max_pending=100, queue_wait_ms=60_000, admission_ms=60_000)
                async with asyncio.timeout(10):  # the live waits would hold it for 30 s
                    taken = await round_
                return [lease.job_id for lease in first], [lease.job_id for lease in taken], exec_id
            finally:
                victim.resume()  # a killed one: nothing to do
                await redis.aclose()

        first, taken, exec_id = asyncio.run(scenario())
    assert first == [] and taken == [exec_id]


def test_a_schedule_of_a_primary_still_up_fires(slow_to_fail_over: LocalCluster) -> None:
    """A schedule whose partition is up fires its occurrences while another primary is down:
    the pass that fires it used to fail on the dead primary's LOOK first, every time."""
    cluster = slow_to_fail_over
    with partitions(16):
        owners, victim, _ = partition_owners(cluster)
        name = next(f"s{n}" for n in range(1000) if owners[keys.schedule_partition(f"s{n}")] is not victim)
        every_second = ScheduleSpec(name=name, cron="* * * * * *", tool="tick", grace=30)

        async def scenario() -> int:
            client = RedisConnector("redis://localhost/0", tuple(cluster.nodes.split(","))).client(
                socket_timeout=2, socket_connect_timeout=2)
            loop = JobLoop(client, tools=TOOLS, group=GROUP, settings=WorkerSettings(), schedules=[every_second])
            try:
                await loop.tick()  # the client knows the slots
                victim.kill()
                async with asyncio.timeout(10):  # an occurrence a second, within its grace
                    while not await client.hget(keys.schedule(name), "fired"):
                        await asyncio.sleep(await loop.tick())
                return int(await client.hget(keys.schedule(name), "fired"))
            finally:
                await client.aclose()

        assert asyncio.run(scenario()) >= 1


def test_the_callback_loop_delivers_in_the_partitions_of_the_primaries_still_up(
        slow_to_fail_over: LocalCluster) -> None:
    """A finished job's callback in a live partition is attempted while another primary is down
    (here to a host not allowed, which ends it at once): the pass used to fail on the dead
    primary's look."""
    cluster = slow_to_fail_over
    with partitions(16):
        _, victim, up = partition_owners(cluster)

        async def scenario() -> tuple[int, int]:
            client = RedisConnector("redis://localhost/0", tuple(cluster.nodes.split(","))).client(
                socket_timeout=2, socket_connect_timeout=2)
            loop = CallbackLoop(client, NotifySettings(secret=SECRET, hosts=("allowed.example",)))
            try:
                await loop.tick()  # the client knows the slots
                for p in up:
                    await pending(client, keys.new_job_id(p))
                victim.kill()
                attempted = 0
                async with asyncio.timeout(10):
                    while attempted < len(up):
                        attempted += await loop.tick()
                    await loop.idle()  # each attempt made and recorded
                left = sum([await client.zcard(keys.callbacks_due(p)) for p in up])
                return attempted, left
            finally:
                await client.aclose()

        attempted, left = asyncio.run(scenario())
    assert (attempted, left) == (len(up), 0)


def test_a_script_that_waits_for_replicas_loads_on_its_own_primary_while_another_is_dead(
        slow_to_fail_over: LocalCluster) -> None:
    """With CARMY_REDIS_WAIT_REPLICAS, a script's first run on a live primary (answered NOSCRIPT)
    loaded it on every primary, so it failed on the dead one: the partitions still up refused
    every script their primaries had not run yet, for as long as another primary was down."""
    cluster = slow_to_fail_over
    script = Script("TEST_DURABLE_FIRST_RUN", "return redis.call('INCR', KEYS[1])")
    with partitions(16):
        _, victim, up = partition_owners(cluster)

        async def scenario() -> list[int]:
            client = RedisConnector("redis://localhost/0", tuple(cluster.nodes.split(","))).client(
                socket_timeout=2, socket_connect_timeout=2)
            durable = bind(client, script, durability=Durability(replicas=1, timeout_ms=200))
            try:
                await client.initialize()  # the client knows the slots
                victim.kill()
                return [await durable([keys.partition_prefix(p) + "first-run"], []) for p in up]
            finally:
                await client.aclose()

        assert asyncio.run(scenario()) == [1] * len(up)
