"""The fault injector: a seeded schedule of faults, played against the cluster one at a time.

Every kind in ``--faults`` comes once, in a seeded order, before any comes again, so even a
short run sees each of them; then kinds are drawn at random. Each fault is logged (stderr and
the run's record) with when it began and when its target was whole again.

Which kinds a run may play depends on its Redis: ``redis-term`` and ``redis-kill`` restart the
single Redis on its files; ``redis-failover`` kills the primary of a Sentinel group
(``--sentinel``), waits for the promotion of a replica and brings the old primary back as a
replica. Against a Sentinel group, the first two are refused rather than aimed at the current
primary: killing a primary there *is* a failover (the Sentinels promote a replica after 1 s of
silence), and restarting it 1–4 s later would race that promotion. Against a Redis Cluster
(``--cluster``), ``cluster-failover`` kills the primary that serves a partition's slot, waits for
its replica's promotion and restarts it as that one's replica; ``cluster-hang`` stops it instead
(``SIGSTOP``: a node that answers nothing and resets nothing) until its replica is promoted, then
wakes it; ``slot-migrate`` moves a
partition's slot, keys and all, to another primary while the load goes on. ``redis-full`` plays
against any: every server's ``maxmemory`` is set below what it holds for 1–4 s, then lifted.
So does ``deploy``, a rolling deploy's step: a worker of a new release of the tools (one tool
described anew, so a new group with queues of its own) started and serving, then a worker of an
older release drained; workers started after it serve the new release.
"""

from __future__ import annotations

import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import cast

from redis.crc import key_slot

from carmy_worker.store import keys
from chaos.cluster import Cluster
from chaos.model import FAULT_KINDS, Fault, FaultKind, RedisKind

PAUSE_S = (3.0, 8.0)  # how long a worker stays stopped (SIGSTOP, then SIGCONT)
REDIS_DOWN_S = (1.0, 4.0)  # how long Redis stays down: around the ~2.3 s the issue found to matter
GAP_S = (2.0, 5.0)  # quiet time between two faults
# How long a hung primary stays stopped after its replica was promoted (``cluster-hang``): past a
# worker's ``store.batch.STALL_S``, so that an outcome sent to it is answered only if it is sent
# again to the new primary.
HANG_HOLD_S = 6.0
BURST = 256  # concurrent calls of an overload burst
# The kinds that need one Redis of the three; every other kind plays against any.
ONLY: dict[FaultKind, RedisKind] = {"redis-term": "single", "redis-kill": "single", "redis-failover": "sentinel",
                                    "cluster-failover": "cluster", "cluster-hang": "cluster", "slot-migrate": "cluster"}
# What each Redis's own crash is, for the refusal's way out.
CRASH: dict[RedisKind, str] = {"single": "redis-kill", "sentinel": "redis-failover", "cluster": "cluster-failover"}
OPTION: dict[RedisKind, str] = {"single": "no --sentinel nor --cluster", "sentinel": "--sentinel",
                                "cluster": "--cluster"}


# Played only when named (``--faults``): a ``deploy`` whose old release loses its last worker to a
# ``kill -9`` while it runs an idempotent job's attempt leaves that attempt in the old group's
# queue, answered once its start window (a job's: an hour) has passed again: longer than a run,
# whose job rows then count the job lost (chaos/README.md, "The deploy fault").
OPT_IN: frozenset[FaultKind] = frozenset({"deploy"})


def default_kinds(redis: RedisKind) -> list[FaultKind]:
    """Every kind the run's Redis allows but the opt-in ones: ``--faults``'s default."""
    return [kind for kind in FAULT_KINDS if ONLY.get(kind, redis) == redis and kind not in OPT_IN]


def refusal(kinds: list[str], redis: RedisKind) -> str | None:
    """Why ``kinds`` cannot be played against the run's Redis, or None if they can."""
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown:
        return f"unknown faults: {', '.join(unknown)}"
    for kind in kinds:
        needs = ONLY.get(cast(FaultKind, kind), redis)  # a known kind: checked above
        if needs != redis:
            return (f"{kind} needs {OPTION[needs]}; against this run's Redis ({OPTION[redis]}), its crash is "
                    f"{CRASH[redis]}")
    return None


def partition_slot(partition: int) -> int:
    """The hash slot of every key of ``partition`` (its ``{c:N}`` tag)."""
    return key_slot(keys.partition_prefix(partition).encode())


def schedule(kinds: list[FaultKind], seed: int) -> Iterator[tuple[FaultKind, float]]:
    """Endless (kind, gap before it): every kind once in a shuffled order, then at random."""
    rng = random.Random(seed)
    first = list(kinds)
    rng.shuffle(first)
    for kind in first:
        yield kind, rng.uniform(*GAP_S)
    while True:
        yield rng.choice(kinds), rng.uniform(*GAP_S)


class Injector:
    """Plays faults on ``cluster`` until ``until`` (wall clock); ``burst`` starts an overload."""

    def __init__(self, cluster: Cluster, kinds: list[FaultKind], seed: int, burst: Callable[[int], float],
                 started: float) -> None:
        self.cluster = cluster
        self.kinds = kinds
        self.rng = random.Random(seed + 1)
        self.seed = seed
        self.burst = burst  # starts n calls at once and returns when they were all sent
        self.started = started
        self.faults: list[Fault] = []

    def run(self, until: float) -> None:
        if not self.kinds:
            time.sleep(max(0.0, until - time.time()))
            return
        for kind, gap in schedule(self.kinds, self.seed):
            if time.time() + gap >= until:
                break
            time.sleep(gap)
            fault = self.inject(kind)
            self.faults.append(fault)
            print(f"[{fault.t - self.started:6.1f} s] {kind:<14} {fault.target:<16} "
                  f"whole again after {fault.t_end - fault.t:4.1f} s {fault.note}", file=sys.stderr, flush=True)

    def inject(self, kind: FaultKind) -> Fault:
        method: dict[FaultKind, Callable[[], Fault]] = {
            "worker-kill": self.worker_kill, "worker-stop": self.worker_stop, "worker-term": self.worker_term,
            "api-kill": self.api_kill, "redis-term": lambda: self.redis_down("redis-term"),
            "redis-kill": lambda: self.redis_down("redis-kill"), "redis-failover": self.redis_failover,
            "cluster-failover": self.cluster_failover, "cluster-hang": self.cluster_hang,
            "slot-migrate": self.slot_migrate,
            "redis-full": self.redis_full, "overload": self.overload, "deploy": self.deploy,
        }
        return method[kind]()

    def worker_kill(self) -> Fault:
        victim = self.rng.choice(self.cluster.workers)
        t = time.time()
        self.cluster.kill_worker(victim)
        replacement = self.cluster.start_worker()
        return Fault(kind="worker-kill", t=t, t_end=time.time(), target=f"worker {victim.pid}", pid=victim.pid,
                     replacement=replacement.pid)

    def worker_stop(self) -> Fault:
        victim = self.rng.choice(self.cluster.workers)
        pause = self.rng.uniform(*PAUSE_S)
        t = time.time()
        victim.signal(signal.SIGSTOP)
        try:
            time.sleep(pause)
        finally:
            victim.signal(signal.SIGCONT)
        return Fault(kind="worker-stop", t=t, t_end=time.time(), target=f"worker {victim.pid}", pid=victim.pid,
                     note=f"paused {pause:.1f} s")

    def worker_term(self) -> Fault:
        victim = self.rng.choice(self.cluster.workers)
        t = time.time()
        self.cluster.terminate_worker(victim)
        replacement = self.cluster.start_worker()
        return Fault(kind="worker-term", t=t, t_end=time.time(), target=f"worker {victim.pid}", pid=victim.pid,
                     replacement=replacement.pid)

    def deploy(self) -> Fault:
        """A rolling deploy's step: a worker of a new release (``put`` described anew, so a group
        and queues of its own) started and serving, then a worker of an older one drained."""
        t = time.time()
        old, new = self.cluster.deploy(self.rng.choice)
        return Fault(kind="deploy", t=t, t_end=time.time(), target=f"worker {old.pid}", pid=old.pid,
                     replacement=new.pid, note=f"release {self.cluster.release}")

    def api_kill(self) -> Fault:
        port = self.rng.choice(self.cluster.ports)
        t = time.time()
        victim = self.cluster.kill_api(port)
        replacement = self.cluster.start_api(port)
        return Fault(kind="api-kill", t=t, t_end=time.time(), target=f"api {victim.pid}", pid=victim.pid,
                     replacement=replacement.pid, note=f"port {port}")

    def redis_down(self, kind: FaultKind) -> Fault:
        down = self.rng.uniform(*REDIS_DOWN_S)
        pid = self.cluster.redis.proc.pid
        t = time.time()
        if kind == "redis-kill":
            self.cluster.redis.kill()
        else:
            self.cluster.redis.stop()  # SIGTERM: Redis writes its AOF out and exits
        time.sleep(max(0.0, t + down - time.time()))
        self.cluster.redis.start()
        return Fault(kind=kind, t=t, t_end=time.time(), target=f"redis {pid}", pid=pid,
                     replacement=self.cluster.redis.proc.pid, note=f"down {down:.1f} s")

    def redis_failover(self) -> Fault:
        t = time.time()
        old, pid, promoted, primary, whole = self.cluster.fail_over()
        return Fault(kind="redis-failover", t=t, t_end=whole, target=f"redis {pid}", pid=pid,
                     replacement=old.proc.pid, promoted=promoted,
                     note=f"port {old.port}; a replica promoted after {promoted - t:.1f} s, primary now :{primary}")

    def cluster_failover(self) -> Fault:
        """``kill -9`` of the primary serving a partition drawn at random (with one partition,
        the primary that holds the store), then its return as a replica."""
        local = self.cluster.redis_cluster()
        partition = self.rng.randrange(keys.partition_count())
        victim = local.owner(partition_slot(partition))
        t = time.time()
        pid, promoted, whole = self.cluster.fail_over_primary(victim)
        return Fault(kind="cluster-failover", t=t, t_end=whole, target=f"redis {pid}", pid=pid,
                     replacement=victim.proc.pid, promoted=promoted,
                     note=f"port {victim.port} (partition {partition}); a replica promoted after {promoted - t:.1f} s")

    def cluster_hang(self) -> Fault:
        """``SIGSTOP`` of the primary serving a partition drawn at random: it hangs (no reply, no
        reset) until its replica is promoted and ``HANG_HOLD_S`` more, then wakes (``SIGCONT``)
        and comes back as that one's replica. Held past the promotion, every outcome a worker
        sent it must be sent again to the new primary (``store.batch.STALL_S``) to be answered in
        time. What its clients sent meanwhile runs when it wakes, before it learns it was
        replaced: a write then may be lost with it, as in a crash."""
        local = self.cluster.redis_cluster()
        partition = self.rng.randrange(keys.partition_count())
        victim = local.owner(partition_slot(partition))
        t = time.time()
        pid, promoted, woke = self.cluster.hang_primary(victim, HANG_HOLD_S)
        return Fault(kind="cluster-hang", t=t, t_end=time.time(), target=f"redis {pid}", pid=pid, promoted=promoted,
                     woke=woke, note=f"port {victim.port} (partition {partition}); a replica promoted after "
                                     f"{promoted - t:.1f} s, the node woken after {woke - t:.1f} s")

    def slot_migrate(self) -> Fault:
        """A partition drawn at random moved, keys and all, to another primary drawn at random."""
        local = self.cluster.redis_cluster()
        partition = self.rng.randrange(keys.partition_count())
        slot = partition_slot(partition)
        source = local.owner(slot)
        target = self.rng.choice([p for p in local.primaries() if p is not source])
        t = time.time()
        held = self.cluster.migrate_slot(slot, target)
        return Fault(kind="slot-migrate", t=t, t_end=time.time(), target=f"slot {slot}",
                     note=f"partition {partition}, {held} keys, :{source.port} to :{target.port}")

    def redis_full(self) -> Fault:
        """Redis out of memory (``noeviction``): every server's maxmemory half of what it holds,
        so that it refuses every write that may grow memory, until it is lifted again."""
        full = self.rng.uniform(*REDIS_DOWN_S)
        servers = self.cluster.servers()
        t = time.time()
        try:
            for server in servers:
                with server.client() as client:
                    used = int(client.info("memory")["used_memory"])
                    client.config_set("maxmemory", used // 2)
            time.sleep(max(0.0, t + full - time.time()))
        finally:
            for server in servers:
                with server.client() as client:
                    client.config_set("maxmemory", 0)
        return Fault(kind="redis-full", t=t, t_end=time.time(), target=f"{len(servers)} redis",
                     note=f"full {full:.1f} s")

    def overload(self) -> Fault:
        t = time.time()
        sent = self.burst(BURST)
        return Fault(kind="overload", t=t, t_end=sent, target=f"{BURST} calls", note="at once")
