"""Clients of a Redis Cluster (``CARMY_REDIS_CLUSTER_NODES``): the target parsed from the
setting and ``CARMY_REDIS_URL``, and ``StoreCluster``, redis-py's asyncio ``RedisCluster`` with
Carmy's retry rules and a bounded number of connections per node.

What redis-py 5.3's ``redis.asyncio.cluster.RedisCluster`` does, and what we change:

* **Routing.** Each command goes to the primary of its key's slot; ``EVALSHA``/``EVAL`` by
  their ``KEYS`` (all in one slot, or ``RedisClusterException`` before anything is sent; no key:
  a random node). A script's SHA must be loaded on the node that runs it: ``store.scripts``
  loads it on ``NOSCRIPT``, which works per node as it does on one server.
* **Redirections.** ``MOVED`` patches the slot table (every 5th rebuilds it) and sends again;
  ``ASK`` sends ``ASKING`` then the command to the importing node; ``TRYAGAIN`` (a multi-key
  command during a migration) is sent again, sleeping 50 ms once half of the 16 tries are used.
  Nothing ran on a node that redirected, so these are always safe, and we keep them.
* **Failures.** ``CLUSTERDOWN`` and an uncovered slot close every connection, sleep 250 ms,
  rebuild the slot table and send again, ``cluster_error_retry_attempts`` times: safe, the
  node refused. A ``ConnectionError`` or ``TimeoutError`` also closes *every* connection of
  the client (in-flight commands on other nodes included) and drops that node from the seeds;
  redis-py then sends the command again. That is not safe for a write: the command may have run
  before the reply was lost, and a script would run twice. ``StoreCluster`` sends again only on
  the refusals; a connection error or timeout reaches the caller, as with one server (Carmy's
  loops reconnect and go on; the API answers the documented retryable error). Until the
  cluster has promoted a replica (``cluster-node-timeout`` + about 1 s), calls for the dead
  primary's slots fail that way.
* **Rebuilding the slot table** (after a connection error, a ``CLUSTERDOWN``, every 5th
  ``MOVED``) makes new ``ClusterNode`` objects and disconnects the old ones, and a connection
  error first closes every node's connections: commands under way on *other* nodes then fail
  with "Connection lost" (seen here under a migration). ``StoreCluster`` keeps the node
  objects it knows (``StoreNodes``) and, inside a command, only marks the table for
  rebuilding: a shard's trouble stays that shard's. A rebuild holds a lock every command waits
  on, and asks each seed for ``CLUSTER SLOTS``, then the first primary for ``COMMAND``, on
  connections without the client's reply timeout: the one is bounded (``SLOTS_TIMEOUT_S``), the
  other asked once per client (``StoreCommands``), so that a hung node holds no command of
  another node's for long.
* **A reply timeout for a few commands** of a client that has none (the worker's LEASE outside
  its waits): ``replies_within``, a bound on each node's exchange that fails as a socket timeout
  would.
* **Pipelines** are not transactions (``pipeline(transaction=True)`` raises): the commands
  are grouped by node and sent to the nodes at once, each reply in its command's place;
  redirected ones are sent again one by one. redis-py sends the whole pipeline again (less
  the commands whose result is truthy) on a connection error: ``StorePipeline`` does not.
* **Connections.** ``max_connections`` is per node, and redis-py raises ``MaxConnectionsError``
  at once when a node's are all busy. ``StoreCluster`` instead lets at most
  ``max_connections`` commands (or pipelines) be under way at once, the others waiting their
  turn up to ``wait`` seconds: a command uses one connection of one node, a pipeline one per
  node, so no node ever needs more, and a burst of calls queues instead of failing.
* **arq's pool.** arq's ``create_pool`` makes an ``ArqRedis`` (a plain ``Redis``): it is not
  cluster-aware, and arq's own claim (``WATCH``/``MULTI`` across a job's keys) and enqueue
  would be ``CROSSSLOT`` or refused in a cluster. Carmy uses neither: LEASE, FINISH and SUBMIT
  are the store's scripts. What arq still sends through the pool it is given
  (``runtime/queue.py``, ``WakeableWorker``): ``run_job``'s first pipeline (``MULTI``, ``GET``
  the job, ``INCR``/``EXPIRE`` its retry key: answered in memory from the lease, never sent;
  it would fail here, a cluster pipeline being no transaction); ``SETEX`` of the retry key
  only when a job's own try count is ahead of it (never: Carmy writes 1); once an hour
  ``record_health``'s ``ZCARD`` of the queue and ``PSETEX`` of its health-check key;
  at ``close``, ``DELETE`` of that key and ``close(close_connection_pool=True)``. The
  single-key commands route by key on a ``StoreCluster``; only ``close`` needed an adapter
  (``RedisCluster.close`` takes no argument): ``StoreCluster.close`` takes arq's argument and
  calls ``aclose``, and ``queue.connect`` gives the client to ``Worker(redis_pool=...)``
  (typed ``ArqRedis`` by a cast). No cron jobs and no aborts (``allow_abort_jobs`` off) means
  arq sends nothing else.
* **Pub/sub**: the asyncio client has none (the synchronous one has ``ClusterPubSub``): see
  ``store.shardpubsub`` for sharded pub/sub; ``StoreCluster.publish`` sends a plain
  ``PUBLISH`` (the catalog's) to any node, which the cluster delivers on every node.
  ``BLPOP`` and other blocking commands work (routed by key), but hold a connection of the
  node for their whole wait.
* **Commands written by hand** on a connection (the batch's lines, ``BLPOP`` then LEASE, a
  script then ``WAIT``) go to the node of their slot: ``NodePool`` and ``held_connection``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from typing import Any, cast

import redis.cluster
from msgspec import Struct
from redis._parsers.commands import AsyncCommandsParser
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, NodesManager, PipelineCommand, RedisCluster
from redis.asyncio.connection import AbstractConnection, SSLConnection, parse_url
from redis.cluster import PRIMARY
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    RedisClusterException,
    RedisError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Where a failover or a migration sends a command again: the node refused it, nothing ran.
REFUSALS = (ClusterDownError, SlotNotCoveredError)
# Tries at the refusals above (each one 250 ms apart, after rebuilding the slot table).
CLUSTER_RETRIES = 8
# Tries at connecting to a node (connecting only: nothing was sent yet).
CONNECT_RETRIES = 2
# How long a node may take to answer ``CLUSTER SLOTS`` before the next seed is asked, or
# ``COMMAND`` (the commands' key positions, ``StoreCommands``) before the next primary is. redis-py
# asks these on the client's own connection to a node, holding the lock of the slot table's reload:
# on a client without a reply timeout (a worker's calls) a hung node (a stopped process, a partition
# without a reset) held every reload, and every command after it, until it woke. A node answers in
# well under a millisecond; the reload is rare, so its one timer costs nothing.
SLOTS_TIMEOUT_S = 1.0
# What the client asks a node about the cluster rather than the data, each within SLOTS_TIMEOUT_S
# (``COMMAND GETKEYS``: where a command's keys are, for the few whose table entry does not say).
_ASKS = frozenset({"CLUSTER SLOTS", "COMMAND", "COMMAND GETKEYS"})
# What a node answers a command written to it by hand (``held_connection``, a batch's line) when
# the slot is elsewhere or moving: nothing ran, and it may be sent again (through the client, which
# follows the redirection, or after reloading the slot table).
# The slot is elsewhere or on its way there (a migration): nothing ran, and the slot table is
# to be reloaded. ``store.reach`` pauses such a partition briefly; ``fanout`` sends its call again.
MOVED = (MovedError, AskError, TryAgainError)
REDIRECTED = (*MOVED, ClusterDownError)

# Options of a redis-py URL that the cluster client takes (its constructor has no **kwargs).
_CLUSTER_OPTIONS = set(inspect.signature(RedisCluster.__init__).parameters) - {"self", "host", "port", "db", "path"}


class ClusterTarget(Struct, frozen=True):
    """The seed nodes of ``CARMY_REDIS_CLUSTER_NODES``, and the options every node's connections
    take from ``CARMY_REDIS_URL``: password, TLS (``rediss://``) and its query's options."""

    nodes: tuple[tuple[str, int], ...]
    options: dict[str, Any] = {}

    @property
    def tls(self) -> bool:
        return bool(self.options.get("ssl"))


def cluster_target(url: str, nodes: tuple[str, ...]) -> ClusterTarget:
    """The target of ``nodes`` (``host:port`` each) with ``url``'s credentials and TLS; the URL's
    host and port are not used. ValueError says what cannot be used."""
    if not url.startswith(("redis://", "rediss://")):
        raise ValueError("with CARMY_REDIS_CLUSTER_NODES, CARMY_REDIS_URL must be redis:// or rediss:// "
                         "(it gives the password and TLS of every node)")
    parsed: dict[str, Any] = dict(parse_url(url))
    if int(parsed.pop("db", 0) or 0):
        raise ValueError("a Redis Cluster has database 0 only: CARMY_REDIS_URL must name /0 or none")
    if parsed.pop("connection_class", None) is SSLConnection:
        parsed["ssl"] = True
    unknown = sorted(set(parsed) - _CLUSTER_OPTIONS - {"host", "port"})
    if unknown:
        raise ValueError(f"option {unknown[0]!r} of CARMY_REDIS_URL does not apply to a cluster")
    options = {k: v for k, v in parsed.items() if k in _CLUSTER_OPTIONS and v is not None}
    return ClusterTarget(nodes=tuple(_node(item) for item in nodes), options=options)


def _node(item: str) -> tuple[str, int]:
    host, _, port = item.rpartition(":")
    return host.strip("[]"), int(port)


class ClusterUnreachable(RedisConnectionError):
    """No seed node answered ``CLUSTER SLOTS`` (or none gave a table covering every slot):
    redis-py says so with ``RedisClusterException``, which is no ``RedisError``, so Carmy's
    loops, which reconnect on ``RedisError``, would take it for a bug."""


_holding: ContextVar[bool] = ContextVar("carmy_cluster_turn", default=False)
# The bound ``replies_within`` puts on each node's exchange in its block (None: none).
_within: ContextVar[float | None] = ContextVar("carmy_cluster_within", default=None)


@contextlib.contextmanager
def replies_within(seconds: float) -> Iterator[None]:
    """Each command a node is sent in the block, connecting to it included, is given up after
    ``seconds`` with redis-py's ``TimeoutError``, as a socket timeout would be (the connection
    dropped, the slot table reloaded before the next command, the node asked last for it): a
    bound for a few commands of a client without a reply timeout (a worker's LEASE outside its
    waits). It bounds each node's own exchange, not the reload of the slot table before it,
    which is bounded on its own (``SLOTS_TIMEOUT_S``): a cancellation there would make redis-py
    close every node's connections, those of other commands under way too."""
    token = _within.set(seconds)
    try:
        yield
    finally:
        _within.reset(token)


class StoreNode(ClusterNode):
    """redis-py's node, which takes a connection back when sending on it failed (a node it
    could not connect to, say): redis-py's counts it as busy for good, and once that happened
    ``max_connections`` times the node refuses every command (``MaxConnectionsError``). redis-py
    hid that by replacing every node when it rebuilt its slot table; ``StoreNodes`` keeps them.
    The nodes redis-py makes become this class in ``StoreNodes.set_nodes`` (no new slots)."""

    __slots__ = ()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        bound = SLOTS_TIMEOUT_S if args[0] in _ASKS else _within.get()
        if bound is None:
            return await self._execute(*args, **kwargs)
        try:
            async with asyncio.timeout(bound):
                return await self._execute(*args, **kwargs)
        except TimeoutError:  # the connection is closed: a reply may still come
            raise RedisTimeoutError(f"no reply to {args[0]} from {self.name} within {bound:g} s") from None

    async def _execute(self, *args: Any, **kwargs: Any) -> Any:
        connection = self.acquire_connection()
        try:
            await connection.send_packed_command(connection.pack_command(*args), False)
            return await self.parse_response(connection, args[0], **kwargs)
        finally:
            self._free.append(connection)

    async def execute_pipeline(self, commands: list[PipelineCommand]) -> bool:
        connection = self.acquire_connection()
        try:
            await connection.send_packed_command(connection.pack_commands(cmd.args for cmd in commands), False)
            failed = False
            for cmd in commands:
                try:
                    cmd.result = await self.parse_response(connection, cmd.args[0], **cmd.kwargs)
                except Exception as exc:
                    cmd.result, failed = exc, True
            return failed
        finally:
            self._free.append(connection)


def _ours(node: ClusterNode) -> ClusterNode:
    if type(node) is ClusterNode:
        node.__class__ = StoreNode
    return node


class StoreNodes(NodesManager):
    """redis-py's slot table, which keeps the ``ClusterNode`` of a node it already knows when
    it is rebuilt (redis-py makes a new one and disconnects the old, commands under way on it
    included), and makes every node a ``StoreNode``."""

    __slots__ = ()

    def set_nodes(self, old: dict[str, ClusterNode], new: dict[str, ClusterNode], remove_old: bool = False) -> None:
        for node in new.values():
            _ours(node)
        if old is self.nodes_cache:
            kept = {name: old[name] for name, node in new.items() if name in old and old[name] is not node}
            for name, node in kept.items():
                node.server_type = new[name].server_type
                new[name] = node
            if kept:
                for nodes in {id(n): n for n in self.slots_cache.values()}.values():
                    nodes[:] = [kept.get(node.name, node) for node in nodes]
        super().set_nodes(old, new, remove_old)


class StoreCommands(AsyncCommandsParser):
    """redis-py's table of the commands' key positions (``COMMAND``, what routes a command
    other than a script by its keys), asked once per client rather than at every reload of the
    slot table: redis-py asked it each time, of the table's first primary, holding the reload's
    lock, so that on a client without a reply timeout a first primary that hangs held every
    command of the client, those for the other primaries too, until it woke. The commands are
    the nodes', not the slots'; a command the table does not know asks again (redis-py's
    ``get_keys``). The first ask goes to the table's first primary, then to each other in turn,
    each within ``SLOTS_TIMEOUT_S`` (``StoreNode``)."""

    __slots__ = ("_primaries",)

    def __init__(self, primaries: Callable[[], list[ClusterNode]]) -> None:
        super().__init__()
        self._primaries = primaries

    async def initialize(self, node: ClusterNode | None = None) -> None:
        if node is not None:
            self.node = node  # where ``COMMAND GETKEYS`` goes
            if self.commands:  # a reload of the slot table
                return
        failed: RedisError | None = None
        for asked in (self.node, *(n for n in self._primaries() if n is not self.node)):
            try:
                commands = await asked.execute_command("COMMAND")
            except RedisError as exc:  # hung, dead, or no longer a primary: the next one
                failed = exc
                continue
            self.commands = {cmd.lower(): command for cmd, command in commands.items()}
            return
        raise failed or RedisClusterException("no primary known to ask for its commands")


class StoreCluster(RedisCluster):
    """``RedisCluster`` that sends a command again only where a node refused it (``REFUSALS``,
    and the redirections), and lets ``max_connections`` commands be under way at once, the
    others waiting up to ``wait`` seconds (then ``ConnectionError``, as ``StorePool``'s)."""

    ERRORS_ALLOW_RETRY = REFUSALS  # type: ignore[assignment]  # fewer than redis-py's, on purpose

    def __init__(self, *, max_connections: int, wait: float | None, **options: Any) -> None:
        options.setdefault("cluster_error_retry_attempts", CLUSTER_RETRIES)
        options.setdefault("connection_error_retry_attempts", CONNECT_RETRIES)
        super().__init__(max_connections=max_connections, **options)
        manager = self.nodes_manager
        seeds = [_ours(node) for node in manager.startup_nodes.values()]
        self.nodes_manager = StoreNodes(seeds, manager.require_full_coverage, manager.connection_kwargs,
                                        address_remap=manager.address_remap, event_dispatcher=self._event_dispatcher)
        self.commands_parser = StoreCommands(lambda: self.nodes_manager.get_nodes_by_server_type(PRIMARY))
        self.patience = wait  # not ``wait``: that is the WAIT command's method
        self.lines: set[AbstractConnection] = set()  # the batches' connections (``NodePool``)
        self._turns = asyncio.Semaphore(max_connections)

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Room for one command or pipeline; a call made while holding one (a pipeline's
        redirected command) does not wait for another."""
        if _holding.get():
            yield
            return
        try:
            async with asyncio.timeout(self.patience):
                await self._turns.acquire()
        except TimeoutError:
            raise RedisConnectionError(f"No connection available within {self.patience:g} s.") from None
        token = _holding.set(True)
        try:
            yield
        finally:
            _holding.reset(token)
            self._turns.release()

    async def initialize(self) -> StoreCluster:
        try:
            await super().initialize()
        except RedisClusterException as exc:
            raise ClusterUnreachable(str(exc)) from exc
        return self

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Close every connection; but called by redis-py inside a command (after a connection
        error or ``CLUSTERDOWN``), only rebuild the slot table before the next command.
        ``close_connection_pool`` is ``Redis.aclose``'s, so that a caller closes either client
        alike: a cluster client's connections are always its own."""
        if _holding.get():
            self._initialize = True
            return
        self._initialize = False  # redis-py closes nothing while a reload is due
        await super().aclose()
        lines, self.lines = self.lines, set()
        for conn in lines:
            await conn.disconnect()

    async def close(self, close_connection_pool: bool | None = None) -> None:
        """``aclose``, under the name and signature arq's worker closes its pool with
        (``close(close_connection_pool=True)``; redis-py's own ``close`` takes nothing)."""
        await self.aclose()

    async def publish(self, channel: str, message: str | bytes) -> int:
        """``PUBLISH`` (redis-py's asyncio cluster client has none) on a random node: a cluster
        delivers a plain message to the subscribers of every node. Its count is that node's."""
        return int(await self.execute_command("PUBLISH", channel, message, target_nodes=self.RANDOM))

    def reload_slots(self) -> None:
        """Load the slot table again before the next command (a node answered ``MOVED`` or
        failed to a caller that talks to it directly: ``store.batch``, ``held_connection``)."""
        self._initialize = True

    def primary_for(self, key: str | bytes) -> ClusterNode:
        """The node serving ``key``'s slot, per the slot table now (loaded: ``initialize``)."""
        return self.nodes_manager.get_node_from_slot(self.keyslot(key))

    async def load_script_for(self, key: str | bytes, source: str) -> None:
        """``SCRIPT LOAD`` on the primary of ``key``'s slot alone, where a call with that key runs
        it. redis-py's ``script_load`` goes to every primary: one that is down (until its replica
        is promoted) would keep the script from every other one."""
        await self.execute_command("SCRIPT LOAD", source, target_nodes=self.primary_for(key))

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self.turn():
            return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> StorePipeline:
        if transaction or shard_hint:
            raise RedisClusterException("a cluster pipeline is not a transaction (MULTI/EXEC)")
        return StorePipeline(self)  # type: ignore[abstract]  # redis-py's stubs: connection_pool


@contextlib.asynccontextmanager
async def held_connection(redis: Any, key: str) -> AsyncIterator[AbstractConnection]:
    """A connection serving ``key``'s slot, held by the caller for commands it writes and reads
    itself (the worker's ``BLPOP`` then LEASE): one of the pool's on one Redis, one of the
    slot's primary on a cluster. A connection whose use failed is closed before it goes back
    (a reply may be left unread on it); on a cluster, such a failure or a redirection
    (``MOVED``, ``ASK``: the slot is elsewhere, nothing ran) also reloads the slot table before
    the next command, so that the caller's retry goes to the slot's new primary."""
    if not isinstance(redis, StoreCluster):
        pool = redis.connection_pool
        conn = await pool.get_connection()
        try:
            yield conn
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)
        return
    async with redis.turn():
        await redis.initialize()
        node = redis.primary_for(key)
        conn = node.acquire_connection()
        try:
            yield conn
        except BaseException as exc:
            await conn.disconnect()
            if isinstance(exc, (RedisConnectionError, TimeoutError, MovedError, AskError, *REFUSALS)):
                redis.reload_slots()
            raise
        finally:
            node._free.append(conn)


class NodePool:
    """One node's connections, lent as a pool lends them (``get_connection``, ``release``): a
    ``store.batch`` line to the node serving its calls' slot. A line is held outside the
    client's turns (its many calls in flight are no command's turn), so it is not one of the
    node's ``max_connections``: each is a connection of its own, closed by the batch when it
    gives the line up, or with the client (``StoreCluster.lines``)."""

    def __init__(self, cluster: StoreCluster, node: ClusterNode) -> None:
        self.cluster = cluster
        self.node = node

    async def get_connection(self) -> AbstractConnection:
        conn = self.node.connection_class(**self.node.connection_kwargs)
        self.cluster.lines.add(conn)
        try:
            await conn.connect()
        except BaseException:
            self.cluster.lines.discard(conn)
            raise
        return conn

    async def release(self, conn: AbstractConnection) -> None:
        """Forget ``conn``, which the batch has closed."""
        self.cluster.lines.discard(conn)


def as_redis(cluster: StoreCluster) -> Redis:
    """A cluster client where the store takes a ``Redis``: it answers the same commands (routed
    by key, refusals retried as ``store.cluster`` says). Where the two differ (a connection held
    for commands written by hand, a pipeline, pub/sub), the store asks which it has
    (``store.batch``, ``store.durable``, ``store.cluster.held_connection``, the listeners)."""
    return cast(Redis, cluster)


class StorePipeline(ClusterPipeline):
    """A cluster pipeline sent once: redirected commands are sent again one by one (as
    redis-py does), but after a connection error nothing is sent again (redis-py would resend
    every command whose reply was falsy or an error)."""

    ERRORS_ALLOW_RETRY = ()  # type: ignore[assignment]  # none, on purpose

    def __init__(self, client: StoreCluster) -> None:
        super().__init__(client)
        self._store = client

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        async with self._store.turn():
            return await super().execute(raise_on_error=raise_on_error, allow_redirections=allow_redirections)


def sync_cluster(target: ClusterTarget, **options: Any) -> redis.cluster.RedisCluster:
    """A synchronous cluster client (the heartbeat thread, the health check), with the same
    rule: refusals are tried again, connection errors and timeouts are the caller's."""
    nodes = [redis.cluster.ClusterNode(host, port) for host, port in target.nodes]
    try:  # redis-py's synchronous client loads the slot table as it is made
        return _SyncCluster(startup_nodes=nodes, **{**target.options, **options})  # type: ignore[no-any-return]
    except RedisClusterException as exc:
        raise ClusterUnreachable(str(exc)) from exc


class LazySyncCluster:
    """``sync_cluster``'s client, made on its first command rather than at once: redis-py's
    synchronous cluster client loads its slot table as it is made, where a one-server client
    connects on first use; a caller that makes its client once and then reconnects on errors
    (the heartbeat thread) would otherwise die of a cluster unreachable at that moment. Until
    one is made, each command tries again, raising ``ClusterUnreachable`` (a
    ``ConnectionError``) while no seed answers."""

    def __init__(self, target: ClusterTarget, **options: Any) -> None:
        self._target = target
        self._options = options
        self._client: redis.cluster.RedisCluster | None = None
        self._making = threading.Lock()  # one client, when a thread makes it while another asks

    def client(self) -> redis.cluster.RedisCluster:
        if self._client is None:
            with self._making:
                if self._client is None:
                    self._client = sync_cluster(self._target, **self._options)
        return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client(), name)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> LazySyncCluster:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class _SyncCluster(redis.cluster.RedisCluster):
    ERRORS_ALLOW_RETRY = REFUSALS  # type: ignore[assignment]  # fewer than redis-py's, on purpose
