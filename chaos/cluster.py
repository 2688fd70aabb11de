"""The processes of a chaos run: a private durable redis-server (or, with ``replicas``, a
primary, replicas and three Sentinels; with ``clustered``, a Redis Cluster of three primaries
and three replicas; each server with its AOF), API replicas on fixed ports and workers serving
``chaos.tools``, each of which the faults may kill, pause or stop, and which ``heal`` brings back
to the configured numbers.

Starting and signalling processes is ``bench/processes.py``'s; this module only knows which
processes the run has. Its methods must be called from the main thread: the kernel's
parent-death signal (so a killed run leaves nothing behind) follows the thread that started
each child.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import httpx
import redis
import redis.cluster

from bench.localcluster import ClusterServer, LocalCluster
from bench.processes import ROOT, Proc, RedisServer, ReplicatedRedis, StartError, on_free_port, wait_until
from bench.procs import log_message
from chaos.tools import tools

START_TIMEOUT = 30.0  # seconds for a process to be ready (a busy two-core machine)
FAILOVER_TIMEOUT = 30.0  # seconds for the Sentinels to promote a replica
# ... and for the old primary to follow the new one: Sentinel leaves a returning primary alone
# for about 10 s before it tells it to replicate.
SETTLE_TIMEOUT = 60.0
TOOLS_MODULE = "chaos.tools"
# CARMY_AUDIT_MAX_ENTRIES of the run: far more entries than any run writes (a 600 s run about
# 100,000), so that the janitors' trim never takes one and the end can count every execution's.
AUDIT_MAX_ENTRIES = 10_000_000
EXECUTION_ID = re.compile(r"exec_[0-9a-f-]{36}")
# A cluster node silent this long is failed over. LocalCluster's 2 s is for idle tests: under the
# chaos load on two cores a primary may miss that, and a failover nobody asked for is the
# cluster's double failover (a deposed primary's last writes wiped), as the Sentinels' 1 s was.
CLUSTER_NODE_TIMEOUT_MS = 3000


class Cluster:
    """Redis, ``apis`` API processes and ``workers`` worker processes, on this machine."""

    def __init__(self, workdir: Path, *, apis: int, workers: int, fsync: str, env: dict[str, str],
                 replicas: int = 0, clustered: bool = False, partitions: int = 1,
                 worker_args: list[str] | None = None) -> None:
        self.workdir = workdir
        self.worker_args = worker_args or []  # after the tools' module (chaos.imported: --openapi)
        self.ledger_dir = workdir / "ledger"
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        # With replicas: Redis as production runs it, behind Sentinel; ``redis`` is then the
        # server started as the primary, which a failover may have made a replica since.
        # A primary must keep one replica to take writes (min-replicas-to-write 1), as production
        # should run it: a primary the Sentinels demoted but never reached then refuses writes
        # instead of taking writes the failover discards (the double failover in chaos/README.md).
        # The Sentinels wait 3 s before they call a primary down: with 1 s, a replica just
        # promoted on this busy machine was taken for down in turn, and failed over again.
        self.group = ReplicatedRedis(workdir, replicas=replicas, durable=True, fsync=fsync,
                                     min_replicas=1 if replicas > 1 else 0, down_after_ms=3000) if replicas else None
        # A Redis Cluster instead: APIs and workers get its nodes (CARMY_REDIS_CLUSTER_NODES).
        self.local = LocalCluster(workdir / "cluster", durable=True, fsync=fsync,
                                  node_timeout_ms=CLUSTER_NODE_TIMEOUT_MS) if clustered else None
        # The single server (redis-term, redis-kill), the group's first primary, or the cluster's first node.
        self.redis = (self.group.primary if self.group else self.local.servers[0] if self.local
                      else RedisServer(workdir, durable=True, fsync=fsync))
        self.partitions = partitions
        self.n_apis = apis
        self.ports: list[int] = []  # the APIs', chosen as each first starts (``start``)
        self.api_procs: dict[int, Proc] = {}  # by port
        self.workers: list[Proc] = []  # serving or paused; a draining one is moved to ``retired``
        self.retired: list[Proc] = []
        self.n_workers = workers
        # The release of the tools new workers serve (``deploy``; 0: the run's first), and each
        # worker's: a worker started in place of another (a kill, ``heal``) serves the latest.
        self.release = 0
        self.releases: dict[int, int] = {}  # by pid
        self._env = env
        self._count = 0

    @property
    def bases(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    @property
    def redis_url(self) -> str:
        return self.group.url if self.group else self.local.url if self.local else self.redis.url

    def servers(self) -> list[RedisServer]:
        """Every data server of the run (not the Sentinels)."""
        if self.group:
            return self.group.servers()
        return list(self.local.servers) if self.local else [self.redis]

    def reader(self) -> redis.Redis | redis.cluster.RedisCluster:
        """A synchronous client of the store as it is now, for the end's reads: the server that
        takes writes (the one the Sentinels name), or the whole cluster."""
        if self.local:
            return self.local.client()
        server = self.group.server_on(self.group.primary_port()) if self.group else self.redis
        client: redis.Redis = server.client()
        return client

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in self._env.items() if not k.startswith("CARMY_")}
        env.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "CHAOS_LEDGER_DIR": str(self.ledger_dir)})
        env.update({k: v for k, v in self._env.items() if k.startswith("CARMY_")})
        # Over any caller's: the run's own Redis, named as the check reads it, and every entry kept.
        env.update({"CARMY_REDIS_URL": self.redis_url, "CARMY_REDIS_PARTITIONS": str(self.partitions),
                    "CARMY_AUDIT_MAX_ENTRIES": str(AUDIT_MAX_ENTRIES)})
        env.pop("CARMY_REDIS_CLUSTER_NODES", None)
        if self.local:
            env["CARMY_REDIS_CLUSTER_NODES"] = self.local.nodes
        env.update(extra or {})
        return env

    def start(self) -> None:
        if self.group:
            self.group.start(START_TIMEOUT)
        elif self.local:
            self.local.start(2 * START_TIMEOUT)
        else:
            self.redis.start()
        for _ in range(self.n_workers):
            self.start_worker()
        # Each API's port is chosen as it starts, and chosen again if it was taken meanwhile:
        # the Redis servers and workers started before it open connections of their own, and
        # one of those may take a port that was free a moment ago (a CI run saw it).
        def first_start(port: int) -> int:
            self.start_api(port)
            return port

        while len(self.ports) < self.n_apis:
            self.ports.append(on_free_port(first_start))
        names = {tool.name for tool in tools}
        for base in self.bases:
            with httpx.Client(timeout=2) as client:
                deadline = time.monotonic() + START_TIMEOUT
                while not names <= {t["name"] for t in client.get(base + "/agent/tools").json()["tools"]}:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{base} does not list the chaos tools")
                    time.sleep(0.1)

    def _proc(self, kind: str, args: list[str], env: dict[str, str]) -> Proc:
        self._count += 1
        name = f"{kind}-{self._count}"
        return Proc(name, args, env, self.workdir / f"{name}.log", kind)

    def start_worker(self) -> Proc:
        release = {"CHAOS_RELEASE": str(self.release)} if self.release else {}
        proc = self._proc("worker", [sys.executable, "-m", "carmy_worker", TOOLS_MODULE, *self.worker_args],
                          self.env(release))
        self.releases[proc.pid] = self.release
        proc.wait_for_log("serving", START_TIMEOUT)
        self.workers.append(proc)
        return proc

    def start_api(self, port: int) -> Proc:
        """``python -m api`` on ``port`` (the same one after a kill, so clients find it again)."""
        proc = self._proc("api", [sys.executable, "-m", "api"], self.env({"CARMY_PORT": str(port)}))
        try:
            proc.wait_for_http(f"http://127.0.0.1:{port}/health", START_TIMEOUT)
        except StartError:
            self.retired.append(proc)  # closed with the rest (its log stays for the reader)
            raise
        self.api_procs[port] = proc
        return proc

    # Faults ------------------------------------------------------------------------------------

    def kill_worker(self, proc: Proc) -> None:
        proc.kill()
        self.workers.remove(proc)
        self.retired.append(proc)

    def terminate_worker(self, proc: Proc) -> None:
        """SIGTERM: it drains (finishes what it runs, takes nothing new) and exits by itself."""
        proc.signal(signal.SIGTERM)
        self.workers.remove(proc)
        self.retired.append(proc)

    def deploy(self, pick: Callable[[list[Proc]], Proc]) -> tuple[Proc, Proc]:
        """One step of a rolling deploy of a new release (``put`` described anew: a new group):
        a worker of it started and serving, then one of an older release, ``pick``ed, drained
        (SIGTERM), so the fleet keeps its size. (The worker drained, the one started.)"""
        self.release += 1
        new = self.start_worker()
        old = pick([p for p in self.workers if self.releases[p.pid] != self.release])
        self.terminate_worker(old)
        return old, new

    def kill_api(self, port: int) -> Proc:
        proc = self.api_procs[port]
        proc.kill()
        self.retired.append(proc)
        return proc

    def fail_over(self) -> tuple[RedisServer, int, float, int, float]:
        """``kill -9`` of the primary the Sentinels name; once they have promoted a replica, the
        old primary started again on its port and files, as it was configured, for the
        Sentinels to make it a replica. (The killed server, its pid, when a replica was promoted,
        the primary's port once the group was whole again, and when.) On a busy machine the
        Sentinels may fail over once more before the group settles: the port tells."""
        group = self.group
        if group is None:
            raise RuntimeError("a failover needs the Sentinel cluster (--sentinel)")
        old = group.server_on(group.primary_port())
        pid = old.proc.pid
        old.kill()
        group.wait_failover(old.port, FAILOVER_TIMEOUT)
        promoted = time.time()
        old.start(START_TIMEOUT)
        primary = wait_until(group.settled, SETTLE_TIMEOUT, "the group whole again", interval=0.1)
        return old, pid, promoted, cast(int, primary), time.time()

    def fail_over_primary(self, victim: ClusterServer) -> tuple[int, float, float]:
        """``kill -9`` of the cluster's primary ``victim``; once its replica has been promoted and
        every slot is served again, ``victim`` started again on its port and files, where it
        finds its slots taken and becomes the new primary's replica. (Its pid, when the replica
        was promoted, when the cluster was whole again.)"""
        local = self.redis_cluster()
        pid = victim.proc.pid
        local.kill_primary(local.primaries().index(victim), SETTLE_TIMEOUT)
        promoted = time.time()
        local.restart(victim, SETTLE_TIMEOUT)
        return pid, promoted, time.time()

    def hang_primary(self, victim: ClusterServer, hold: float) -> tuple[int, float, float]:
        """``SIGSTOP`` of the cluster's primary ``victim`` until its replica has been promoted
        and ``hold`` s more, then ``SIGCONT``: it comes back as the new primary's replica. (Its
        pid, when the replica was promoted, when it was woken; the cluster is whole on return.)"""
        pid = victim.proc.pid
        local = self.redis_cluster()
        promoted = local.hang_primary(victim, SETTLE_TIMEOUT, wake=False)
        try:
            time.sleep(hold)
        finally:
            woke = time.time()
            victim.resume()
        local.wait_ok(SETTLE_TIMEOUT)
        return pid, promoted, woke

    def migrate_slot(self, slot: int, target: ClusterServer) -> int:
        """Moves ``slot``, keys and all, to the primary ``target`` (MIGRATE in batches, as
        ``redis-cli --cluster reshard`` does) while the load goes on; returns how many keys it
        held as the move began."""
        local = self.redis_cluster()
        with local.owner(slot).check_client() as client:
            held = int(client.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
        local.move_slot(slot, target, SETTLE_TIMEOUT)
        return held

    def redis_cluster(self) -> LocalCluster:
        """The run's Redis Cluster (a cluster fault against another Redis is a mistake)."""
        if self.local is None:
            raise RuntimeError("this fault needs the Redis Cluster (--cluster)")
        return self.local

    # Back to whole -----------------------------------------------------------------------------

    def heal(self) -> None:
        """Every paused worker continued, and every process that is missing started again."""
        for proc in self.workers:
            proc.signal(signal.SIGCONT)
        for server in self.servers():
            if not server.proc.alive():
                if self.local and isinstance(server, ClusterServer):
                    self.local.restart(server, SETTLE_TIMEOUT)
                else:
                    server.start()
        for port, proc in list(self.api_procs.items()):
            if not proc.alive():
                self.start_api(port)
        for proc in [p for p in self.workers if not p.alive()]:
            self.workers.remove(proc)
            self.retired.append(proc)
        while len(self.workers) < self.n_workers:
            self.start_worker()

    def all_procs(self) -> list[Proc]:
        return list({id(p): p for p in [*self.workers, *self.retired, *self.api_procs.values()]}.values())

    def log_errors(self) -> dict[str, int]:
        """Error lines of every process's log, counted by message (execution ids left out)."""
        counts: dict[str, int] = {}
        for proc in self.all_procs():
            for line in proc.error_lines():
                first = EXECUTION_ID.sub("exec_…", log_message(line)).strip().splitlines() or [""]
                message = first[0][:160]
                counts[message] = counts.get(message, 0) + 1
        return counts

    def close(self) -> None:
        for proc in self.all_procs():
            proc.signal(signal.SIGCONT)
            proc.close()
        if self.group:
            self.group.stop()
        elif self.local:
            self.local.stop()
        else:
            self.redis.stop()
