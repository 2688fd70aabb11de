"""A Redis Cluster on loopback: six ``redis-server --cluster-enabled yes`` processes (three
primaries, three replicas) joined with ``redis-cli --cluster create``, for the tests, the
benchmark and the chaos check (issue 34).

Each node is a ``RedisServer`` (bench/processes.py) in a folder of its own, where it keeps its
``nodes.conf`` and, when ``durable``, its AOF. The cluster bus gets a free port of its own
(``cluster-port``): the default, the data port + 10,000, is past 65535 for half of the
ephemeral range. ``cluster-node-timeout`` is short (2 s by default) so that a primary killed
is replaced within a few seconds.

Which node is a primary changes with failovers: ``primaries()`` and ``replicas()`` ask the
cluster (``CLUSTER NODES``) each time, never the order of start.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import redis
import redis.cluster

from bench.processes import RedisServer, StartError, free_port, wait_until

SLOTS = 16384
NODE_TIMEOUT_MS = 2000
RESTART_SETTLE_S = 15.0  # how long a restarted node's cluster may take to agree before it is mended
# Each check of a node is bounded: a node killed a moment ago must not hold the wait up.
CHECK_TIMEOUTS = {"socket_timeout": 2, "socket_connect_timeout": 2}


class ClusterServer(RedisServer):
    """One node of a ``LocalCluster``: a ``RedisServer`` with the cluster enabled."""

    def __init__(self, workdir: Path, *, durable: bool, fsync: str, node_timeout_ms: int,
                 password: str | None = None) -> None:
        super().__init__(workdir, durable=durable, fsync=fsync)
        self.node_timeout_ms = node_timeout_ms
        self.password = password
        self.bus_port = free_port()
        self._up = False

    def extra_args(self) -> list[str]:
        if not self._up:  # a first start that failed may have lost its bus port too
            self.bus_port = free_port()
        auth = ["--requirepass", self.password, "--masterauth", self.password] if self.password else []
        return ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-port", str(self.bus_port), "--cluster-node-timeout", str(self.node_timeout_ms), *auth]

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0" if self.password else super().url

    def start(self, timeout: float = 30.0) -> None:
        super().start(timeout)
        self._up = True

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def check_client(self) -> redis.Redis:
        """A client whose every call is bounded (for polling a node that may be gone)."""
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password,
                           **CHECK_TIMEOUTS)  # type: ignore[arg-type]

    def node_id(self) -> str:
        with self.check_client() as client:
            return cast(str, client.execute_command("CLUSTER", "MYID").decode())

    def info(self, section: str) -> dict[str, object]:
        with self.check_client() as client:
            return cast(dict[str, object], client.info(section))

    def cpu(self) -> float:
        """Seconds of CPU this redis-server has used (``INFO cpu``: system + user)."""
        info = self.info("cpu")
        return float(cast(float, info["used_cpu_sys"])) + float(cast(float, info["used_cpu_user"]))


class NodeLine:
    """One line of ``CLUSTER NODES``."""

    def __init__(self, line: str) -> None:
        fields = line.split()
        self.id = fields[0]
        self.port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
        self.flags = set(fields[2].split(","))
        self.primary_id = None if fields[3] == "-" else fields[3]
        self.slots = fields[8:]

    @property
    def failed(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "noaddr", "handshake"})

    @property
    def is_primary(self) -> bool:
        return "master" in self.flags

    def first_slot(self) -> int:
        return min((int(s.split("-")[0]) for s in self.slots if not s.startswith("[")), default=SLOTS)


class LocalCluster:
    """Three primaries and their three replicas on free loopback ports, under ``workdir``.

    ``start()`` returns once every node says ``cluster_state:ok``, every slot is served and
    every replica is in sync. ``nodes`` is the seed list for ``CARMY_REDIS_CLUSTER_NODES``.
    ``durable`` gives each node its AOF (``fsync`` is its appendfsync), as ``ReplicatedRedis``.
    ``password``: every node requires it (and replicas use it); ``url`` carries it, the form of
    ``CARMY_REDIS_URL`` beside ``CARMY_REDIS_CLUSTER_NODES``.
    """

    def __init__(self, workdir: Path, *, primaries: int = 3, durable: bool = False, fsync: str = "everysec",
                 node_timeout_ms: int = NODE_TIMEOUT_MS, password: str | None = None) -> None:
        self.workdir = workdir
        self.password = password
        self.servers = [ClusterServer(self._dir(f"node-{i + 1}"), durable=durable, fsync=fsync,
                                      node_timeout_ms=node_timeout_ms, password=password)
                        for i in range(2 * primaries)]

    def _dir(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def nodes(self) -> str:
        """Every node as ``host:port``, comma-separated: ``CARMY_REDIS_CLUSTER_NODES``."""
        return ",".join(server.address for server in self.servers)

    @property
    def url(self) -> str:
        """``CARMY_REDIS_URL`` for this cluster: the password, if any (its host is not used)."""
        return self.servers[0].url

    # Lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        for server in self.servers:
            server.start()
        self._cli("--cluster", "create", *(s.address for s in self.servers), "--cluster-replicas", "1",
                  "--cluster-yes", timeout=timeout)
        self.wait_ok(timeout)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def restart(self, server: ClusterServer, timeout: float = 60.0) -> None:
        """Starts a node that was killed or stopped again, on its port and files: it finds its
        slots served by the replica promoted meanwhile and comes back as that one's replica.

        Once, in CI, Redis 7.0.15 did not settle: as the old primary came back (300 slots had
        moved to it just before it was killed), the replica promoted in its place dropped one of
        them from its own table, while every other node still said that replica served it; that
        node then said ``cluster_state:fail`` for good, and every later test on the cluster
        failed. If the nodes do not agree within ``RESTART_SETTLE_S``, ``give_back_unserved``
        has the slot claimed again by the primary the others name, and the wait goes on."""
        server.start()
        self.settle(timeout)

    def wake(self, server: ClusterServer, timeout: float = 60.0) -> None:
        """``SIGCONT`` of a node ``hang_primary`` left stopped; it comes back as the promoted
        replica's replica, and the wait is ``restart``'s (Redis 7.0.15 once dropped a slot there
        too, in CI, as the woken node came back)."""
        server.resume()
        self.settle(timeout)

    def settle(self, timeout: float = 60.0) -> None:
        """Waits for the cluster to be whole, mending after ``RESTART_SETTLE_S`` a slot that no
        primary serves in its own table (``give_back_unserved``)."""
        try:
            self.wait_ok(min(timeout, RESTART_SETTLE_S))
        except TimeoutError:
            self.give_back_unserved()
            self.wait_ok(timeout)

    def give_back_unserved(self) -> list[int]:
        """Each slot no live primary says it serves itself is claimed again (``CLUSTER
        ADDSLOTS``, then ``BUMPEPOCH`` so that the claim wins) by the primary most other nodes
        say serves it, or by the first primary if none does; returns those slots."""
        primaries = self.primaries()
        served: set[int] = set()  # the slots some primary says it serves itself
        ports: set[int] = set()  # the primaries that answered for themselves
        named: dict[int, list[int]] = {}  # slot -> the ports other nodes say serve it
        for server in self.live():
            with server.check_client() as client:
                text = client.execute_command("CLUSTER", "NODES").decode()
            for line in map(NodeLine, text.splitlines()):
                if not line.is_primary or line.failed:
                    continue
                slots = {slot for item in line.slots if not item.startswith("[") for slot in _slots(item)}
                if "myself" in line.flags:
                    served |= slots
                    ports.add(line.port)
                else:
                    for slot in slots:
                        named.setdefault(slot, []).append(line.port)
        unserved = [slot for slot in range(SLOTS) if slot not in served]
        for slot in unserved:
            claimants = [port for port in named.get(slot, []) if port in ports]
            port = max(set(claimants), key=claimants.count) if claimants else primaries[0].port
            with self.server_on(port).check_client() as client:
                client.execute_command("CLUSTER", "ADDSLOTS", slot)
                client.execute_command("CLUSTER", "BUMPEPOCH")
        return unserved

    # What the cluster says now -----------------------------------------------------------------

    def live(self) -> list[ClusterServer]:
        return [server for server in self.servers if server._proc is not None and server.proc.alive()]

    def client(self) -> redis.cluster.RedisCluster:
        """A synchronous client of the whole cluster, found through its live nodes."""
        nodes = [redis.cluster.ClusterNode("127.0.0.1", server.port) for server in self.live()]
        whole: redis.cluster.RedisCluster = redis.cluster.RedisCluster(startup_nodes=nodes, password=self.password)
        return whole

    def topology(self) -> list[NodeLine]:
        """``CLUSTER NODES`` as the first live node that answers sees it."""
        for server in self.live():
            try:
                with server.check_client() as client:
                    text = client.execute_command("CLUSTER", "NODES")
            except redis.RedisError:
                continue
            return [NodeLine(line) for line in (text.decode() if isinstance(text, bytes) else text).splitlines()]
        raise redis.ConnectionError("no node of the cluster answers")

    def primaries(self) -> list[ClusterServer]:
        """The primaries that serve slots, by their first slot (the first serves slot 0)."""
        lines = sorted((n for n in self.topology() if n.is_primary and not n.failed and n.slots),
                       key=NodeLine.first_slot)
        return [self.server_on(n.port) for n in lines]

    def replicas(self) -> list[ClusterServer]:
        return [self.server_on(n.port) for n in self.topology() if not n.is_primary and not n.failed]

    def server_on(self, port: int) -> ClusterServer:
        return next(server for server in self.servers if server.port == port)

    def primary_cpu(self) -> dict[int, float]:
        """Each primary's Redis CPU so far, in seconds, by port: the bench's share per primary is
        the difference of two readings."""
        return {server.port: server.cpu() for server in self.primaries()}

    def healthy(self) -> bool:
        """Every live node says the cluster is ok with every slot served, and knows the same
        primaries; every live replica is in sync with its primary."""
        return self.problem() is None

    def problem(self) -> str | None:
        """What keeps the cluster from ``healthy``, in words (None: nothing)."""
        owners: set[tuple[tuple[int, tuple[str, ...]], ...]] = set()
        live = self.live()
        for server in live:
            info = _cluster_info(server)
            if info.get("cluster_state") != "ok" or int(info.get("cluster_slots_ok", 0)) != SLOTS:
                return f"{server.address} says {info.get('cluster_state')}, {info.get('cluster_slots_ok')} slots ok"
            replication = server.info("replication")
            if replication["role"] == "slave" and replication.get("master_link_status") != "up":
                return f"{server.address}, a replica, has its link to {replication.get('master_port')} down"
            with server.check_client() as client:
                text = client.execute_command("CLUSTER", "NODES").decode()
            seen = [n for n in map(NodeLine, text.splitlines()) if not n.failed]
            primaries = tuple(sorted(n.port for n in seen if n.is_primary and n.slots))
            # Every live node known, and every one that serves no slot known as a replica.
            if len(seen) != len(live) or sum(not n.is_primary for n in seen) != len(live) - len(primaries):
                return f"{server.address} sees {len(seen)} of {len(live)} live nodes, primaries {primaries}"
            # Which slots each primary serves, as this node sees it (a migration's [..] marks aside):
            # a replica that has not yet heard of its primary's last slots would, promoted, leave
            # them unserved (seen after a reshard followed at once by a failover).
            owners.add(tuple(sorted((n.port, tuple(s for s in n.slots if not s.startswith("[")))
                                    for n in seen if n.is_primary and n.slots)))
        return None if len(owners) == 1 else f"the nodes disagree on the primaries' slots: {sorted(owners)}"

    def wait_ok(self, timeout: float = 60.0) -> None:
        last: list[str | None] = [None]

        def ok() -> bool:
            last[0] = self.problem()
            return last[0] is None

        try:
            wait_until(ok, timeout, "the cluster ok on every node", interval=0.1)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; last seen: {last[0]}") from None

    # Faults ------------------------------------------------------------------------------------

    def kill_primary(self, index: int = 0, timeout: float = 60.0) -> ClusterServer:
        """``kill -9`` of ``primaries()[index]``; returns it once its replica has been promoted
        and the cluster is ok again without it (about node-timeout + 1 s)."""
        victim = self.primaries()[index]
        victim.kill()

        def promoted() -> bool:
            return victim.port not in {s.port for s in self.primaries()} and self.healthy()

        wait_until(promoted, timeout, f"a replica promoted in place of {victim.address}", interval=0.1)
        return victim

    def hang_primary(self, victim: ClusterServer, timeout: float = 60.0, *, wake: bool = True) -> float:
        """``SIGSTOP`` of the primary ``victim``: a node that hangs (it accepts connections and
        answers nothing; nothing resets its clients' connections) until the other nodes have
        promoted its replica and serve every slot; then ``SIGCONT``, and it comes back as that
        one's replica. Returns when the replica was promoted (the cluster is whole on return).
        With ``wake=False`` it returns still hung, once the replica serves its slots: the caller
        wakes it (``wake``)."""
        others = [server for server in self.live() if server is not victim]
        victim.pause()

        def promoted() -> bool:
            server = others[0]
            try:
                info = _cluster_info(server)
                with server.check_client() as client:
                    text = client.execute_command("CLUSTER", "NODES").decode()
            except redis.RedisError:
                return False
            serving = {n.port for n in map(NodeLine, text.splitlines()) if n.is_primary and not n.failed and n.slots}
            return (info.get("cluster_state") == "ok" and int(info.get("cluster_slots_ok", 0)) == SLOTS
                    and victim.port not in serving)

        try:
            wait_until(promoted, timeout, f"a replica promoted in place of {victim.address}, hung", interval=0.1)
            at = time.time()
        except BaseException:
            victim.resume()
            raise
        if wake:
            self.wake(victim, timeout)
        return at

    def migrate_slots(self, count: int, source: ClusterServer, target: ClusterServer,
                      timeout: float = 120.0) -> None:
        """Moves ``count`` slots, keys and all, from the primary ``source`` to the primary
        ``target`` (``redis-cli --cluster reshard``); clients meanwhile get ASK and MOVED
        redirections. Blocks until done: run it in a thread to keep load going."""
        self._cli("--cluster", "reshard", source.address, "--cluster-from", source.node_id(),
                  "--cluster-to", target.node_id(), "--cluster-slots", str(count), "--cluster-yes",
                  timeout=timeout)
        self.wait_ok(timeout)

    def move_slot(self, slot: int, target: ClusterServer, timeout: float = 60.0) -> None:
        """Moves one slot, keys and all, to the primary ``target``, the way ``redis-cli`` does
        (IMPORTING/MIGRATING, MIGRATE in batches, then SETSLOT NODE on every primary)."""
        source = self.owner(slot)
        if source is target:
            return
        source_id, target_id = source.node_id(), target.node_id()
        with source.check_client() as src, target.check_client() as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                auth = ["AUTH", self.password] if self.password else []
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, *auth, "KEYS", *keys)
            for primary in (target, source, *self.primaries()):
                with primary.check_client() as client:
                    client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        self.wait_ok(timeout)

    def owner(self, slot: int) -> ClusterServer:
        """The primary that serves ``slot`` now."""
        for line in self.topology():
            if line.is_primary and not line.failed and any(_covers(s, slot) for s in line.slots):
                return self.server_on(line.port)
        raise LookupError(f"no primary serves slot {slot}")

    def slots_of(self, server: ClusterServer) -> int:
        """How many slots ``server`` serves, as the cluster says."""
        line = next(n for n in self.topology() if n.port == server.port)
        return sum(_span(s) for s in line.slots if not s.startswith("["))

    def _cli(self, *args: str, timeout: float) -> None:
        binary = shutil.which("redis-cli")
        if binary is None:
            raise StartError("redis-cli is not installed (Debian/Ubuntu: apt-get install redis-tools)")
        log = self.workdir / "redis-cli.log"
        with log.open("ab") as out:
            auth = ["-a", self.password, "--no-auth-warning"] if self.password else []
            code = subprocess.run([binary, *auth, *args], stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout, check=False).returncode
        if code:
            raise StartError(f"redis-cli {' '.join(args[:2])} failed (exit code {code}); its log ({log}) ends with:\n"
                             f"{log.read_text(errors='replace')[-2000:]}")

    def __iter__(self) -> Iterator[ClusterServer]:
        return iter(self.servers)


def _slots(item: str) -> range:
    """The slots of one slot item of ``CLUSTER NODES`` (``5`` or ``0-299``)."""
    first, _, last = item.partition("-")
    return range(int(first), int(last or first) + 1)


def _covers(item: str, slot: int) -> bool:
    if item.startswith("["):  # a slot being migrated or imported
        return False
    first, _, last = item.partition("-")
    return int(first) <= slot <= int(last or first)


def _span(item: str) -> int:
    first, _, last = item.partition("-")
    return int(last or first) - int(first) + 1


def _cluster_info(server: ClusterServer) -> dict[str, str]:
    with server.check_client() as client:
        text = client.execute_command("CLUSTER", "INFO")
    text = text.decode() if isinstance(text, bytes) else text
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
