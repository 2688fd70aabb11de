"""One script run in every partition at once: the roster's beats, the janitor's scans, the
console's pulse (docs/architecture.md, section 3: each partition is a cell, and a reader that
wants the whole deployment asks each cell).

The calls go out in one pipeline, with any plain reads the caller adds behind them: one round
trip on one Redis; on a Redis Cluster the client's pipeline sends each command to its slot's
primary (one round trip per primary). A ``NOSCRIPT`` reply (a restarted Redis, a new primary:
nothing ran) loads the script and runs that call again alone, as ``scripts.run`` does.

On a Redis Cluster such a pipeline is all or nothing when a node cannot be reached: redis-py
takes a connection of every node the pipeline names before it sends anything, so a primary that
was killed (until its replica is promoted) fails the calls bound for every other primary too.
``run_each_alone`` sends each call on its own instead, for a caller whose calls must land
wherever they can (the janitor's scans). A node that hangs rather than
refuses is worse: its connection's handshake waits out the socket timeout before anything is
written anywhere, and a call sent to it alone does so again. ``run_each_by_node_sync`` (the
heartbeat thread's, on a cluster) sends each node its own pipeline, all at once, so that a hung
node costs only its own calls their timeout.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis as sync_redis
import redis.cluster as sync_cluster
from redis.asyncio import Redis
from redis.exceptions import NoScriptError, RedisError

from carmy_worker.store.cluster import MOVED
from carmy_worker.store.scripts import Script, bind_sync, run

Call = tuple[list[Any], list[Any]]  # one call's keys and arguments
log = logging.getLogger("carmy.store")


def _queue(pipe: Any, script: Script, calls: Sequence[Call], then: Callable[[Any], None] | None) -> None:
    for call_keys, args in calls:
        pipe.execute_command(*script.command(call_keys, args))
    if then is not None:
        then(pipe)


def _raised(replies: Sequence[Any]) -> list[Any]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return list(replies)


async def run_each(redis: Redis, script: Script, calls: Sequence[Call],
                   then: Callable[[Any], None] | None = None) -> tuple[list[Any], list[Any]]:
    """Run ``script`` once per call, and ``then``'s reads behind them, in one pipeline: the
    calls' replies in order, and the reads'. The first error is raised."""
    async with redis.pipeline(transaction=False) as pipe:
        _queue(pipe, script, calls, then)
        replies = await pipe.execute(raise_on_error=False)
    for i, (call_keys, args) in enumerate(calls):
        if isinstance(replies[i], NoScriptError):
            replies[i] = await run(redis, script, call_keys, args)
    return _raised(replies[:len(calls)]), _raised(replies[len(calls):])


async def run_each_alone(redis: Redis, script: Script, calls: Sequence[Call]) -> list[Any]:
    """``script`` once per call, each in a round trip of its own and all at once: every call
    whose node answers runs, whatever becomes of the others. The reply of each, or the
    ``RedisError`` (or ``OSError``) it got."""
    replies = await asyncio.gather(*(run(redis, script, call_keys, args) for call_keys, args in calls),
                                   return_exceptions=True)
    for reply in replies:
        if isinstance(reply, BaseException) and not isinstance(reply, RedisError | OSError):
            raise reply
    return list(replies)


async def run_each_reaching(redis: Redis, script: Script, calls: Sequence[Call]) -> list[Any]:
    """``run_each`` (its calls' replies) while every node answers; when its pipeline fails (on
    a cluster, as a whole, one primary being down), each call alone (``run_each_alone``): then
    the reply of each call is its reply or its error. For sweeps whose every partition's part
    stands alone (the janitor's scans, the audit trail's trims)."""
    try:
        replies, _ = await run_each(redis, script, calls)
    except (RedisError, OSError):
        if len(calls) < 2:
            raise
        return await run_each_alone(redis, script, calls)
    return replies


def run_each_sync(redis: sync_redis.Redis, script: Script, calls: Sequence[Call],
                  then: Callable[[Any], None] | None = None) -> tuple[list[Any], list[Any]]:
    """``run_each`` on a blocking client (the heartbeat thread's, the health check's)."""
    with redis.pipeline(transaction=False) as pipe:
        _queue(pipe, script, calls, then)
        replies = pipe.execute(raise_on_error=False)
    alone = bind_sync(redis, script)
    for i, (call_keys, args) in enumerate(calls):
        if isinstance(replies[i], NoScriptError):
            replies[i] = alone(call_keys, args)
    return _raised(replies[:len(calls)]), _raised(replies[len(calls):])


def reload_on_connections_of_its_own(cluster: Any, last: Collection[str] = ()) -> None:
    """A blocking cluster client's slot table loaded again, each seed asked for it on a client
    made for the asking, and the seeds named in ``last`` (nodes that just failed) asked last.
    redis-py asks the seeds in turn until one answers, so a hung node asked first would make the
    reload wait out its timeout before anything else. It asks each seed on the seed's own client
    and then disconnects that client's pool, connections in use included; after a first load
    the seeds are the very nodes the client sends to (redis-py makes them so), whose connections
    other threads may be reading (a beat's node-sender threads: ``EBADF`` on a node that
    answered). Copies of the seeds have no client: redis-py makes one to ask each, and
    disconnects only that."""
    manager = cluster.nodes_manager
    seeds = sorted(manager.startup_nodes.items(), key=lambda seed: seed[0] in last)  # stable
    manager.startup_nodes = {name: sync_cluster.ClusterNode(node.host, node.port, node.server_type)
                             for name, node in seeds}
    manager.initialize()


class _Reads:
    """What a caller's ``then`` asks of a pipeline (``GET``s), kept to be sent to each key's node."""

    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = []

    def get(self, key: str) -> None:
        self.commands.append(("GET", key))


def reload_slots(redis: sync_redis.Redis, unreached: Collection[str]) -> None:
    """Reload a blocking cluster client's slot table if a node could not be reached or timed
    out: a dead or hung primary's replica may serve its slots now. ``unreached``: the names of the
    nodes whose calls failed (``run_each_by_node_sync``), asked last
    (``reload_on_connections_of_its_own``), so that the reload costs one round trip to a node that
    answers, and the caller's next call goes where the slots are now."""
    if not unreached:
        return
    try:
        reload_on_connections_of_its_own(redis, last=unreached)
    except Exception as exc:  # no seed answered: the next failure tries again
        log.debug("slot table not reloaded: %s", exc)


class ReloadAside:
    """``reload_slots`` in a thread of its own, one at a time for a client: for a caller that
    must not wait on it (the check a worker's async tools wait for before their next step). The
    nodes that failed are asked last, but seeds that hang and did not fail the call (a replica
    beside a hung primary, a worker cut off from several nodes) are asked in turn, each for its
    timeout. The client is used meanwhile, on its table as it was: redis-py swaps a reloaded
    table in whole."""

    def __init__(self, redis: sync_redis.Redis) -> None:
        self.redis = redis
        self._running = threading.Lock()

    def __call__(self, unreached: Collection[str]) -> None:
        if not unreached or not self._running.acquire(blocking=False):
            return  # nothing failed, or a reload is under way (a failure after it asks again)

        def reload() -> None:
            try:
                reload_slots(self.redis, unreached)
            finally:
                self._running.release()

        threading.Thread(target=reload, name="carmy-slot-reload", daemon=True).start()


def run_each_by_node_sync(redis: sync_redis.Redis, script: Script, calls: Sequence[Call],
                          then: Callable[[Any], None] | None = None,
                          pool: ThreadPoolExecutor | None = None,
                          unreached: set[str] | None = None) -> tuple[list[Any], list[Any]]:
    """``run_each_sync`` on a blocking cluster client, as one pipeline per node, all sent at once
    (a thread each, of ``pool``: a caller that runs this every second keeps one; else a pool for
    this call alone): the calls' replies in order, and the reads' (``then`` may ask for ``GET``s),
    each a reply or the ``RedisError`` its node gave. A node that hangs costs its own calls its
    socket timeout; the other nodes' calls land and answer meanwhile. A call a node refused
    (``NOSCRIPT``, ``MOVED``, ``ASK``, ``TRYAGAIN``: nothing ran) is sent again alone through the
    client, which loads the script or follows the slot.

    A node unreached leaves the slot table as it is (its name goes into ``unreached``, if
    given): the caller reloads it once it is done sending (``reload_slots``), as a beat in
    rounds does after its last, so that a reload neither holds its next rounds back nor runs
    beside them."""
    cluster: Any = redis  # a LazySyncCluster or redis-py's RedisCluster
    reads = _Reads()
    if then is not None:
        then(reads)
    commands = [script.command(call_keys, args) for call_keys, args in calls] + reads.commands
    routed = [call_keys[0] for call_keys, _ in calls] + [command[1] for command in reads.commands]
    by_node: dict[str, tuple[Any, list[int]]] = {}
    for i, key in enumerate(routed):
        node = cluster.get_node_from_key(key)
        by_node.setdefault(node.name, (node, []))[1].append(i)
    replies: list[Any] = [None] * len(commands)

    def send(node: Any, indices: list[int]) -> None:
        try:
            with cluster.get_redis_connection(node).pipeline(transaction=False) as pipe:
                for i in indices:
                    pipe.execute_command(*commands[i])
                answered = pipe.execute(raise_on_error=False)
        except RedisError as exc:
            answered = [exc] * len(indices)
            if unreached is not None:
                unreached.add(node.name)
        for i, reply in zip(indices, answered, strict=True):
            replies[i] = reply

    if pool is None:
        with ThreadPoolExecutor(max(1, len(by_node))) as own:
            list(own.map(lambda item: send(*item), by_node.values()))
    else:
        list(pool.map(lambda item: send(*item), by_node.values()))
    alone = bind_sync(redis, script)
    for i, (call_keys, args) in enumerate(calls):
        if isinstance(replies[i], (NoScriptError, *MOVED)):
            try:
                replies[i] = alone(call_keys, args)
            except RedisError as exc:
                replies[i] = exc
    return replies[:len(calls)], replies[len(calls):]
