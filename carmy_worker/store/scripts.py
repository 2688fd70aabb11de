"""Every Lua script of the store, and the one way each is run.

A script is a ``Script`` made once, at import, in the store module that owns its keys, and
known here by name (``SCRIPTS``): one place lists every script, so that a check can ask each one
what it may do over ``maxmemory`` (``store.lua``'s flags) and, for Redis Cluster, which keys it
declares. A module calls its scripts through ``Runs`` objects made by ``bind``, each behind one
typed wrapper method (named parameters in, a typed result out), so no caller outside the store
builds a script's ``KEYS`` or ``ARGV``.

How a call goes out is said once, when it is bound, and nowhere else:

* alone: ``EVALSHA`` on a connection of the client's pool;
* with ``durability`` (``CARMY_REDIS_WAIT_REPLICAS`` > 0): ``EVALSHA`` then ``WAIT`` in one round
  trip on one connection (``store.durable``), on a cluster one of the slot's primary;
* in a ``batch``: written with the other calls of its turn of the event loop (``store.batch``);
* alone, ``within`` a bound: each reply, connecting included, within that many seconds on a
  client without a reply timeout (``replied_within``: the worker's LEASE outside its waits).

Whichever way, a ``NOSCRIPT`` reply (a new primary after a failover, a restarted Redis, a flushed
script cache: nothing ran) loads the script and runs it once more, in ``run``. The three places
that write ``EVALSHA`` on a connection themselves, the batch, the worker's ``BLPOP``-then-LEASE and
``store.fanout`` (one script in every partition, pipelined: the beats, the janitor's scans, the
console's PULSE), take the command from ``Script.command`` and fall back on ``run`` when Redis
does not know the script.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any

import redis as sync_redis
from redis.asyncio import Redis
from redis.cluster import RedisCluster as SyncCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError

from carmy_worker.store.cluster import LazySyncCluster, StoreCluster, replies_within
from carmy_worker.store.durable import run_durable_on_node

if TYPE_CHECKING:
    from carmy_worker.store.batch import Batch, FollowUp
    from carmy_worker.store.durable import Durability

# A call that waits for replicas (``durability``) goes out on its own, never in a batch, and
# gets its replies within this much past its WAIT's own timeout, as a batch's calls get theirs
# within ``store.batch.STALL_S``: a worker's calls have no reply timeout, and a primary that hangs
# (a stopped process, a partition without a reset) would hold its outcome until it woke. A timer
# per call, where the WAIT's round trip already costs far more.
DURABLE_STALL_S = 5.0


def hung(what: str, seconds: float) -> RedisConnectionError:
    """The error of a call given up on a Redis that did not answer (``what``: what it waited
    for) within ``seconds``: a lost connection's, since what was sent may have run."""
    return RedisConnectionError(f"{what} within {seconds:g} s: Redis is hung or cut off")


@contextlib.asynccontextmanager
async def answered_within(seconds: float, what: str = "no reply") -> AsyncIterator[None]:
    """The block, on a timer of its own, given up after ``seconds`` with ``hung``'s error: for
    the calls' rare paths on a client without a reply timeout (a worker's), where a timer per
    call costs nothing. A read on the calls' usual path shares one timer (``carmy_worker.deadlines``)."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise hung(what, seconds) from None


@contextlib.asynccontextmanager
async def replied_within(redis: Redis, seconds: float, what: str = "no reply") -> AsyncIterator[None]:
    """The block's commands on ``redis`` given up after ``seconds``, connecting included, with
    the error of a lost connection (what was sent may have run): on one Redis the block as a
    whole (``answered_within``); on a cluster each node's own exchange, as a socket timeout
    would end it (``cluster.replies_within``), since a cancellation during the reload of the
    slot table before it would close the connections of every node."""
    if isinstance(redis, StoreCluster):
        with replies_within(seconds):
            yield
    else:
        async with answered_within(seconds, what):
            yield


class Script:
    """One Lua script: its name (for errors, logs and the list of all), source and SHA1."""

    __slots__ = ("name", "sha", "source")
    name: str
    source: str
    sha: str

    def __init__(self, name: str, source: str) -> None:
        known = SCRIPTS.get(name)
        if known is not None and known.source != source:
            raise ValueError(f"two scripts are named {name}")
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        SCRIPTS[name] = self

    def command(self, keys: list[Any], args: list[Any]) -> tuple[Any, ...]:
        """The ``EVALSHA`` that runs it (not the script in a pipeline: redis-py would first
        check that it exists, a round trip more on every call)."""
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def __repr__(self) -> str:
        return f"Script({self.name})"


# Every script of the store, by name, in the order their modules were imported.
SCRIPTS: dict[str, Script] = {}


async def run(redis: Redis, script: Script, keys: list[Any], args: list[Any],
              durability: Durability | None = None, within: float | None = None) -> Any:
    """Run ``script`` once: ``EVALSHA``, loading it first if Redis does not know it; with
    ``durability``, ``WAIT`` for its replicas in the same round trip (``store.durable``), both
    replies within ``DURABLE_STALL_S`` plus the ``WAIT``'s own timeout (``ConnectionError``
    past it: the script may have run); else, ``within``: each reply within that many seconds
    (``replied_within``)."""
    if durability is not None and durability.replicas:
        async with answered_within(DURABLE_STALL_S + durability.timeout_ms / 1000,
                                   f"no reply to {script.name} and its WAIT"):
            return await _run(redis, script, keys, args, durability)
    if within is not None:
        async with replied_within(redis, within, f"no reply to {script.name}"):
            return await _run(redis, script, keys, args, None)
    return await _run(redis, script, keys, args, None)


async def _run(redis: Redis, script: Script, keys: list[Any], args: list[Any], durability: Durability | None) -> Any:
    if durability is not None and isinstance(redis, StoreCluster):
        return await run_durable_on_node(redis, script, keys, args, durability)
    for _ in range(2):
        if durability is not None and durability.replicas:
            async with redis.pipeline(transaction=False) as pipe:
                pipe.execute_command(*script.command(keys, args))
                pipe.wait(durability.replicas, durability.timeout_ms)
                reply, acked = await pipe.execute(raise_on_error=False)
            if isinstance(reply, NoScriptError):
                await load(redis, script, keys)
                continue
            if isinstance(reply, Exception):
                raise reply
            if isinstance(acked, Exception):
                raise acked
            durability.acknowledged(int(acked))
            return reply
        try:
            return await redis.execute_command(*script.command(keys, args))
        except NoScriptError:  # nothing ran
            await load(redis, script, keys)
    raise NoScriptError(f"script {script.name} ({script.sha}) is not loaded")


async def load(redis: Redis, script: Script, keys: list[Any]) -> None:
    """Load ``script`` where a call with ``keys`` runs it (its ``EVALSHA`` was answered
    ``NOSCRIPT``): on one Redis, there; on a cluster, on the primary of the keys' slot alone
    (``StoreCluster.load_script_for``): loaded on every primary, a worker's first PROMOTE on a
    node failed in every partition of the cluster while one primary was down, not only in its."""
    if isinstance(redis, StoreCluster) and keys:
        await redis.load_script_for(keys[0], script.source)
    else:
        await redis.script_load(script.source)


def several_nodes(redis: sync_redis.Redis) -> bool:
    """Whether ``redis`` is a blocking cluster client, whose calls may go to several nodes."""
    return isinstance(redis, LazySyncCluster | SyncCluster)


def load_sync(redis: sync_redis.Redis, script: Script, keys: list[Any]) -> None:
    """``load`` on a blocking client."""
    if several_nodes(redis) and keys:
        cluster: Any = redis  # a LazySyncCluster or redis-py's RedisCluster
        cluster.execute_command("SCRIPT LOAD", script.source, target_nodes=cluster.get_node_from_key(keys[0]))
    else:
        redis.script_load(script.source)


class Runs:
    """``script`` bound to a client and to the way its calls go out; called with its keys and
    arguments, like a redis-py script. Made by ``bind``."""

    __slots__ = ("batch", "durability", "redis", "script", "within")

    def __init__(self, redis: Redis, script: Script, durability: Durability | None, batch: Batch | None,
                 within: float | None = None) -> None:
        self.redis = redis
        self.script = script
        self.durability = durability if durability is not None and durability.replicas else None
        # Calls that wait for replicas keep their own round trip and WAIT: never batched.
        self.batch = batch if self.durability is None else None
        self.within = within

    async def __call__(self, keys: list[Any], args: list[Any]) -> Any:
        return await self.queue(keys, args)

    def queue(self, keys: list[Any], args: list[Any], *, sent: asyncio.Future[None] | None = None,
              before: tuple[Any, ...] | None = None) -> Awaitable[Any]:
        """The call, started now if batched (queued for this turn's write; ``sent`` set once it is
        written: ``Batch.call``), else when awaited (``sent`` is then never set). ``before``: a
        plain command sent just ahead of it, its reply dropped (``Batch.call``)."""
        if self.batch is not None:
            return self.batch.call(self.script, keys, args, sent=sent, before=before)
        if before is not None:
            return self._run_after(before, keys, args)
        return run(self.redis, self.script, keys, args, self.durability, self.within)

    async def _run_after(self, before: tuple[Any, ...], keys: list[Any], args: list[Any]) -> Any:
        await send_before(self.redis, before)
        return await run(self.redis, self.script, keys, args, self.durability, self.within)

    @property
    def batched(self) -> bool:
        """Whether its calls go out in a batch, and so may carry a ``FollowUp`` (``send``)."""
        return self.batch is not None

    def send(self, keys: list[Any], args: list[Any], then: FollowUp, *,
             before: tuple[Any, ...] | None = None) -> asyncio.Future[Any]:
        """Queue a batched call, and ``then`` right behind it in the same write; the call's reply.
        ``before``: as for ``queue``."""
        batch = self.batch
        if batch is None:
            raise RuntimeError(f"{self.script.name} is not batched: it cannot carry a follow-up")
        future = batch.call(self.script, keys, args, hold=True, before=before)
        call = then.make()
        if call is not None:
            then.reply = batch.call(*call, hold=True, follows=then)
            then.reply.add_done_callback(then.answered)  # if not called at once by the reader (a retry)
        batch.flush_if_quiet()
        return future


async def send_before(redis: Redis, before: tuple[Any, ...]) -> None:
    """A call's ``before`` command (``Batch.call``), sent on its own just ahead of the call: its
    reply, or its error, is dropped, as in a batch; the script checks what it needs of it."""
    with contextlib.suppress(RedisError):
        await redis.execute_command(*before)


def bind(redis: Redis, script: Script, *, durability: Durability | None = None, batch: Batch | None = None,
         within: float | None = None) -> Runs:
    """``script`` run on ``redis``: alone, waiting for ``durability``'s replicas, or in ``batch``
    (unless it waits for replicas); alone and not waiting for replicas, ``within`` bounds each
    reply (``run``)."""
    return Runs(redis, script, durability, batch, within)


class SyncRuns:
    """``script`` bound to a blocking client (the heartbeat thread's, the health check's): run
    alone, as ``run`` does, loading it first if Redis does not know it."""

    __slots__ = ("redis", "script")

    def __init__(self, redis: sync_redis.Redis, script: Script) -> None:
        self.redis = redis
        self.script = script

    def __call__(self, keys: list[Any], args: list[Any]) -> Any:
        try:
            return self.redis.execute_command(*self.script.command(keys, args))
        except NoScriptError:  # nothing ran
            load_sync(self.redis, self.script, keys)
            return self.redis.execute_command(*self.script.command(keys, args))


def bind_sync(redis: sync_redis.Redis, script: Script) -> SyncRuns:
    """``script`` run on a blocking client."""
    return SyncRuns(redis, script)
