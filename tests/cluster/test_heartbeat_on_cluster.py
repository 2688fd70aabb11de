"""A worker's heartbeat while one primary of a real Redis Cluster is dead and not yet replaced: it
still lands in every partition whose primary is up. Otherwise every live worker would look dead
there after ``dead_after`` (a failover takes longer), and those partitions' janitors, which kept
watching all along, would reap what the workers run (a non-idempotent tool that began ends
``EXECUTION_UNCERTAIN``, a job's attempt with it: a schedule's occurrence dead-lettered unrun).

The cluster is the test's own, with a node timeout far longer than the test: the dead primary
is never failed over meanwhile, so the beat meets it dead every time."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from bench.localcluster import ClusterServer, LocalCluster
from carmy_worker.runtime.presence import CHECK_TIMEOUT_S, Presence, beat_timeout
from carmy_worker.runtime.runner import Runtime
from carmy_worker.settings import WorkerSettings
from carmy_worker.store import keys, roster
from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.roster import Claims, Holding, SyncLiveness
from carmy_worker.wire import WorkerInfo
from tests.cells import partitions
from tests.cluster.conftest import cluster_client
from tests.holds import Holds

pytestmark = pytest.mark.slow

DEAD_AFTER = 3.0  # the workers' default
BEAT_TIMEOUT_S = beat_timeout(DEAD_AFTER)  # a third of it: 1 s


def beat_threads() -> set[int]:
    """The threads that send a cluster's beat to its nodes (``SyncLiveness``'s)."""
    return {t.ident or 0 for t in threading.enumerate() if t.name.startswith("carmy-beat")}


def test_a_beat_lands_in_the_partitions_of_the_primaries_still_up(slow_to_fail_over: LocalCluster) -> None:
    cluster = slow_to_fail_over
    with partitions(16):
        owners = {p: cluster.owner(key_slot(keys.partition_prefix(p).encode())) for p in keys.partitions()}
        victim = owners[0]
        up = [p for p in keys.partitions() if owners[p] is not victim]
        assert up and len(up) < 16  # 16 partitions are spread over the three primaries
        client = RedisConnector("redis://localhost/0", tuple(cluster.nodes.split(","))).sync_client(
            socket_timeout=BEAT_TIMEOUT_S, socket_connect_timeout=BEAT_TIMEOUT_S)
        liveness = SyncLiveness(client, dead_after=DEAD_AFTER)
        liveness.heartbeat("before")  # the client knows the slots
        senders = beat_threads()
        for _ in range(3):
            liveness.heartbeat("before")
        assert senders and senders <= beat_threads()  # the first beat's threads send the next ones too
        victim.kill()
        sent = time.time() * 1000

        with pytest.raises(redis.ConnectionError):  # the worker knows its beat fell short
            liveness.heartbeat("w")

        for p in up:
            with owners[p].check_client() as node:
                seen = node.zscore(keys.workers(p), "w")
            assert seen is not None and seen >= sent - 1000, f"partition {p} did not see the beat"
        client.close()


@contextlib.contextmanager
def beside_a_hung_primary(cluster: LocalCluster) -> Iterator[tuple[SyncLiveness, dict[int, ClusterServer], list[int]]]:
    """Over 16 partitions, a worker's ``SyncLiveness`` (its heartbeat thread's timeout,
    ``BEAT_TIMEOUT_S``) that knows the slots,
    while the primary of partition 0 hangs (``SIGSTOP``): the liveness, each partition's primary,
    and the partitions of the others."""
    with partitions(16):
        owners = {p: cluster.owner(key_slot(keys.partition_prefix(p).encode())) for p in keys.partitions()}
        victim = owners[0]
        client = RedisConnector("redis://localhost/0", tuple(cluster.nodes.split(","))).sync_client(
            socket_timeout=BEAT_TIMEOUT_S, socket_connect_timeout=BEAT_TIMEOUT_S)
        liveness = SyncLiveness(client, dead_after=DEAD_AFTER)
        liveness.heartbeat("before")  # the client knows the slots
        victim.pause()
        try:
            yield liveness, owners, [p for p in keys.partitions() if owners[p] is not victim]
        finally:
            victim.resume()
            client.close()


def seen_since(owner: ClusterServer, partition: int, sent_ms: float) -> bool:
    """Whether ``partition``'s roster saw worker ``w`` beat since ``sent_ms`` (a second's grace)."""
    with owner.check_client() as node:
        seen = node.zscore(keys.workers(partition), "w")
    return seen is not None and seen >= sent_ms - 1000


def test_a_beat_lands_in_the_partitions_of_the_primaries_still_up_while_another_hangs(
        slow_to_fail_over: LocalCluster) -> None:
    """A primary that hangs (``SIGSTOP``: it answers nothing and resets no connection) rather than
    dies: every beat still lands in every other partition, and gives up within about its socket
    timeout. A cluster pipeline takes a connection of every node before it writes to any: the
    hung node's handshake held each beat back from every partition, 34 s for the first here with
    redis-py's retries, and a live worker went unseen past ``dead_after``, was judged dead, and
    what it ran was run again elsewhere; the hung node, waking, then contradicted one of those
    answers (``bin/chaos --cluster``'s ``cluster-hang``: a flipped answer)."""
    with beside_a_hung_primary(slow_to_fail_over) as (liveness, owners, up):
        for beat in range(2):
            sent = time.time() * 1000
            started = time.monotonic()
            with pytest.raises(redis.RedisError):  # the worker knows its beat fell short
                liveness.heartbeat("w")
            took = time.monotonic() - started
            for p in up:
                assert seen_since(owners[p], p, sent), f"beat {beat}: partition {p} did not see it"
            # Its socket timeout, once: a third of dead_after (``beat_timeout``), below the 2 s it
            # was. A worker's first beat on a hung primary's promoted replica waits it out too.
            assert took < 2, f"beat {beat} took {took:.1f} s"


def test_a_beat_in_parts_waits_out_a_hung_primary_once_not_once_a_round(
        slow_to_fail_over: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that holds more than ``BEAT_SLICE`` executions in a partition beats there in
    parts, a round trip each. A partition whose primary hangs sends none of its later rounds once
    its first has failed: the beat gives up within about one socket timeout, not one for each of
    its rounds (seven here, some 14 s: past ``dead_after`` in every other partition too, whose
    janitors would then judge a live worker dead), and the partitions whose primaries answer
    take every one of their rounds, the last included."""
    monkeypatch.setattr(roster, "BEAT_SLICE", 2)  # ten held a partition: five named parts, a scan, the last
    with beside_a_hung_primary(slow_to_fail_over) as (liveness, owners, up):
        held = [Holding(keys.new_execution_id(p), 1, "") for p in keys.partitions() for _ in range(10)]
        sent = time.time() * 1000
        started = time.monotonic()
        with pytest.raises(redis.RedisError):  # the worker knows its beat fell short
            liveness.heartbeat("w", claims=Claims(held=held))
        took = time.monotonic() - started
        assert took < BEAT_TIMEOUT_S + 1.5, f"the beat took {took:.1f} s"  # its socket timeout, once
        for p in up:
            assert seen_since(owners[p], p, sent), f"partition {p} did not see the beat"
            with owners[p].check_client() as node:
                assert node.exists(keys.beat_named("w", p), keys.beat_scan("w", p)) == 0, \
                    f"partition {p} did not take the beat's last part"


@pytest.mark.timeout(180)  # a failover, then the woken node's settling (mended after 15 s if need be)
def test_the_beat_after_one_that_timed_out_on_a_hung_primary_lands_on_its_promoted_replica(
        redis_cluster: LocalCluster) -> None:
    """A primary hangs and stays hung; the cluster promotes its replica. The beat that times out
    on the hung node reloads the slot table before the next one, so the very next beat lands in
    that primary's partitions too, on the promoted replica, while the old primary is still
    stopped (a reload in the background let the next beats time out on the hung node again).
    The hung node is the seed redis-py would ask first: the reload asks it last, so the failed
    beat costs one timeout, not two. The promoted replica's janitor gives a worker one
    ``dead_after`` from its first look there; every timeout waited on the way comes out of it."""
    cluster = redis_cluster
    with partitions(16):
        slots = {p: key_slot(keys.partition_prefix(p).encode()) for p in keys.partitions()}
        client = RedisConnector("redis://localhost/0", tuple(cluster.nodes.split(","))).sync_client(
            socket_timeout=BEAT_TIMEOUT_S, socket_connect_timeout=BEAT_TIMEOUT_S)
        liveness = SyncLiveness(client, dead_after=DEAD_AFTER)
        liveness.heartbeat("before")  # the client knows the slots, the hung node's among them
        cluster_client: Any = client
        first = next(iter(cluster_client.nodes_manager.startup_nodes.values()))
        assert first.server_type == "primary", "redis-py lists a range's primary first"
        victim = cluster.server_on(first.port)
        theirs = [p for p in keys.partitions() if cluster.owner(slots[p]) is victim]
        assert theirs, "the first seed serves a partition"
        cluster.hang_primary(victim, wake=False)
        try:
            started = time.monotonic()
            with pytest.raises(redis.RedisError):
                liveness.heartbeat("w")  # the slot table still names the hung node: it times out
            took = time.monotonic() - started
            # Its timeout, once: the reload after it asked the nodes that answer first. The hung
            # node asked first would have held the reload for its timeout too.
            assert took < 2 * BEAT_TIMEOUT_S, f"the beat and its reload took {took:.1f} s"
            sent = time.time() * 1000
            for _ in range(20):
                try:
                    liveness.heartbeat("w")  # the next one, on the table the failure reloaded
                    break
                except redis.exceptions.ClusterDownError:
                    # A node not yet back to ok answers CLUSTERDOWN for a moment after the
                    # promotion (not a timeout: the beat did not go to the hung node).
                    time.sleep(0.1)
            else:
                pytest.fail("the cluster still answered CLUSTERDOWN 2 s after the promotion")
            for p in theirs:
                promoted = cluster.owner(slots[p])
                assert promoted is not victim
                with promoted.check_client() as node:
                    seen = node.zscore(keys.workers(p), "w")
                assert seen is not None and seen >= sent - 1000, f"partition {p} did not see the beat"
        finally:
            client.close()
            cluster.wake(victim)  # back, as the new primary's replica: the next test's cluster is whole




class Connector(RedisConnector):
    """A ``RedisConnector`` of ``cluster``'s nodes that keeps the blocking clients it makes."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__("redis://localhost/0", tuple(cluster.nodes.split(",")))
        self.made: list[Any] = []

    def sync_client(self, **options: Any) -> Any:
        client = super().sync_client(**options)
        self.made.append(client)
        return client


def checks_before_steps(cluster: LocalCluster, store: Any = None) -> tuple[Presence, Connector]:
    """Worker ``w``'s ``Presence`` as its tools' steps use it (``ensure_fresh``), holding nothing,
    and the connector that makes its check's client. ``store``: its asyncio client, for
    ``register`` (none is used otherwise)."""
    connector = Connector(cluster)
    presence = Presence(redis=store or redis.asyncio.Redis(), settings=WorkerSettings(dead_after=DEAD_AFTER),
                        info=WorkerInfo(worker_id="w", started_ms=0, tools=[], group="g"),
                        runtime=cast("Runtime", Holds()), connector=connector)
    return presence, connector


async def check_now(presence: Presence) -> float:
    """``ensure_fresh`` with the last heartbeat long gone (a worker that was paused): the seconds
    a tool's next step waited for the check. The event loop runs on meanwhile."""
    late = [0.0]  # how late the loop ran, at most, while the check was out

    async def tick() -> None:
        while True:
            ticked = time.monotonic()
            await asyncio.sleep(0.01)
            late[0] = max(late[0], time.monotonic() - ticked - 0.01)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)  # it ticks from now on
    presence.last_beat = presence._verified = time.monotonic() - 60
    started = time.monotonic()
    try:
        checking = presence.ensure_fresh()
        assert checking is not None, "no check went out"
        await checking
        took = time.monotonic() - started
        await asyncio.sleep(0.05)  # the tick due during the check has come
    finally:
        ticker.cancel()
    assert late[0] < CHECK_TIMEOUT_S / 2, f"the check held the event loop {late[0]:.1f} s"
    return took


async def check_while_hung(presence: Presence, *hung: ClusterServer) -> float:
    """``check_now`` while the nodes ``hung`` hang (``SIGSTOP``), and the tool's next step at
    once; they are woken after."""
    for server in hung:
        server.pause()
    try:
        took = await check_now(presence)
        # The tool's next step, at once: the check that failed is not made again before
        # VERIFY_EVERY_S, counted from its end (it waited out its timeout).
        assert presence.ensure_fresh() is None, "the next step waits out the timeout again"
        return took
    finally:
        for server in hung:
            server.resume()


async def test_a_check_before_a_step_waits_out_one_timeout_beside_hung_seeds_not_one_each(
        slow_to_fail_over: LocalCluster) -> None:
    """A worker cut off from two primaries (both hang), one of them its partition's, in a tool's
    step after a pause: ``ensure_fresh``'s check waits out its timeout on the partition's
    primary, once, and the reload of the slot table that follows runs aside. Made before the
    check answers, it would ask the other hung node first (it did not fail the check, so it is
    not asked last) and hold the step, and every tool of the worker, for one more timeout, and
    one more for each such seed."""
    cluster = slow_to_fail_over
    with partitions(1):
        presence, connector = checks_before_steps(cluster)
        owner = cluster.owner(key_slot(keys.partition_prefix(0).encode()))
        sent = time.time() * 1000
        await check_now(presence)  # the client knows the slots
        assert seen_since(owner, 0, sent), "the partition did not see the check"
        (client,) = connector.made
        seeds = [cluster.server_on(node.port) for node in client.nodes_manager.startup_nodes.values()]
        other = next(seed for seed in seeds if seed is not owner)  # the seed a reload would ask first
        try:
            took = await check_while_hung(presence, owner, other)
            assert took < 2 * CHECK_TIMEOUT_S, f"the step waited {took:.1f} s"
        finally:
            client.close()


@pytest.mark.timeout(180)  # a failover, then the woken node's settling (mended after 15 s if need be)
async def test_a_check_before_a_step_follows_a_failover_once_a_node_timed_out(redis_cluster: LocalCluster) -> None:
    """A primary hangs and its replica is promoted. ``ensure_fresh``'s check times out on the hung
    node; the reload it leads to, aside, puts the promoted replica in its slot table, and the
    next check lands there. A client that never reloaded would send every later check to the
    hung node, and a worker paused through the failover would take its tools' next steps
    unchecked."""
    cluster = redis_cluster
    with partitions(16):
        presence, connector = checks_before_steps(cluster)
        await check_now(presence)  # the client knows the slots, the hung node's among them
        (client,) = connector.made
        first = next(iter(client.nodes_manager.startup_nodes.values()))
        victim = cluster.server_on(first.port)
        slots = {p: key_slot(keys.partition_prefix(p).encode()) for p in keys.partitions()}
        theirs = [p for p in keys.partitions() if cluster.owner(slots[p]) is victim]
        assert theirs, "the first seed serves a partition"
        cluster.hang_primary(victim, wake=False)
        try:
            took = await check_now(presence)  # its table still names the hung node: it times out
            assert took < 2 * CHECK_TIMEOUT_S, f"the step waited {took:.1f} s"

            def reloaded() -> bool:
                return all(client.get_node_from_key(keys.partition_prefix(p)).port != victim.port for p in theirs)

            deadline = time.monotonic() + 10
            while not reloaded():
                assert time.monotonic() < deadline, "the check's client still sends to the hung node"
                await asyncio.sleep(0.05)
            for _ in range(40):  # a node not yet back to ok answers CLUSTERDOWN for a moment
                sent = time.time() * 1000
                await check_now(presence)
                if all(seen_since(cluster.owner(slots[p]), p, sent) for p in theirs):
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("no check landed on the promoted replica in 2 s")
        finally:
            client.close()
            cluster.wake(victim)  # back, as the new primary's replica: the next test's cluster is whole


async def test_the_first_check_before_a_step_finds_the_slot_table_loaded_at_registration(
        slow_to_fail_over: LocalCluster) -> None:
    """``ensure_fresh``'s first check is likely made during a fault (a beat stale but not yet
    failed: a node hangs). Its client connects when the worker registers, so that check does not
    load the slot table first, asking the seeds in the order configured: a hung first seed would
    hold the step for its timeout, and then the check for its own on the same node."""
    cluster = slow_to_fail_over
    with partitions(16):
        asyncio_client = cluster_client(cluster)
        presence, connector = checks_before_steps(cluster, asyncio_client)
        (client,) = connector.made
        first = cluster.servers[0]  # the seed configured first
        assert any(cluster.owner(key_slot(keys.partition_prefix(p).encode())) is first for p in keys.partitions()), \
            "the first seed serves a partition"
        await presence.register()
        presence._stop.set()  # no heartbeat thread from here: the checks in the loop are the test's
        assert presence._thread is not None
        presence._thread.join(5)
        await asyncio.wrap_future(presence._check_thread.submit(lambda: None))  # behind the connect
        try:
            took = await check_while_hung(presence, first)
            assert took < 2 * CHECK_TIMEOUT_S, f"the step waited {took:.1f} s"
        finally:
            client.close()
            await asyncio_client.aclose()
