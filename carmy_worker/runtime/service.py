"""One worker process: presence, janitor, cancel listener, job loop, callback loop (when
callbacks are configured) and the arq loop, started and stopped together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time

from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, ClusterDownError, RedisClusterException, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from carmy_worker import collector
from carmy_worker.jobs.callbacks import CallbackLoop
from carmy_worker.jobs.driver import JobLoop
from carmy_worker.runtime import queue
from carmy_worker.runtime.invoke import contain_tool_tasks
from carmy_worker.runtime.presence import Presence, describe, group_of, new_worker_id
from carmy_worker.runtime.runner import Runtime
from carmy_worker.sdk import lifecycle
from carmy_worker.sdk.toolbox import Tool
from carmy_worker.settings import SettingsError, WorkerSettings
from carmy_worker.store import jobs, keys, partitions, version
from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.durable import Durability
from carmy_worker.store.janitor import Janitor
from carmy_worker.store.pubsub import Message
from carmy_worker.store.shardpubsub import listen
from carmy_worker.tracing import start as start_tracing
from carmy_worker.wire import ScheduleSpec, WorkerInfo

log = logging.getLogger("carmy.worker")

# What a Redis that is not there yet answers: nothing (refused, a timeout), LOADING (a restart
# reading its append-only file: BusyLoadingError is a ConnectionError), a cluster not formed yet.
NOT_YET = (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException, ClusterDownError)
START_BACKOFF_S = 2.0  # the longest wait between two tries to start


async def start_once_reachable(redis: Redis, presence: Presence, partition_count: int) -> None:
    """Redis's version checked, the partition count agreed and this worker registered, once
    Redis answers: a worker may start before its Redis (an orchestrator starts them in any
    order; Redis restarts, or loads its append-only file), and it waits for it, as a running
    worker rides out an outage, rather than stopping with a traceback. Credentials Redis refuses
    are a setting to fix, not a wait (``SettingsError``)."""
    backoff = 0.0
    while True:
        try:
            await version.require(redis)  # before anything runs a script it could not compile
            await partitions.agree(redis, partition_count)  # nor looks for executions where they are not
            await presence.register()
        except AuthenticationError as exc:
            raise SettingsError(f"CARMY_REDIS_URL: Redis refused the credentials ({exc})") from None
        except NOT_YET as exc:
            if not backoff:
                log.warning("Redis unreachable at start (%s); retrying", exc)
            backoff = min(backoff * 2 or 0.1, START_BACKOFF_S)
            await asyncio.sleep(backoff)
            continue
        if backoff:
            log.info("Redis reachable: starting")
        return


async def listen_for_cancels(redis: Redis, runtime: Runtime) -> None:
    """Every worker hears every cancellation, on every partition's channel (sharded); the one
    running the execution acts on it."""

    def on_message(message: Message) -> None:
        if message["type"] == "message":
            runtime.cancel(message["data"].decode())

    channels = [keys.cancel_channel(p) for p in keys.partitions()]  # on a cluster, each on its shard's primary
    await listen(redis, lambda: channels, on_message, name="cancel channel", max_backoff=0.5)


async def serve(tools: list[Tool], settings: WorkerSettings, connector: RedisConnector | None = None,
                schedules: list[ScheduleSpec] | None = None) -> None:
    """Serve ``tools`` until SIGTERM or SIGINT, then drain running executions and leave;
    ``schedules``: the recurring jobs this worker fires (with every other worker that declares
    them: each occurrence is fired once)."""
    connector = connector or RedisConnector(settings.redis_url, settings.redis_cluster_nodes)
    contain_tool_tasks(asyncio.get_running_loop())
    keys.use_partitions(settings.redis_partitions)  # before any key is named
    redis = queue.connect(connector)
    # The loops that run beside the calls (jobs, janitor, callbacks) give up on a hung Redis after
    # a reply timeout (queue.REPLY_TIMEOUT_S); the calls' own path keeps none: a timeout on every
    # read costs each call a few µs, and its waits for work are bounded on their own.
    upkeep = queue.connect(connector, reply_timeout=queue.REPLY_TIMEOUT_S
                           + settings.wait_timeout / 1000 * bool(settings.wait_replicas))
    described = describe(tools, settings)
    info = WorkerInfo(
        worker_id=new_worker_id(), started_ms=int(time.time() * 1000), tools=described,
        group=group_of(described), host=socket.gethostname(), pid=os.getpid(), schedules=list(schedules or ()),
        concurrency=settings.concurrency,
    )
    durability = Durability(settings.wait_replicas, settings.wait_timeout)
    tracing = start_tracing(settings.tracing, service="carmy-worker")
    runtime = Runtime(redis=redis, tools={t.name: t for t in tools}, settings=settings, worker_id=info.worker_id,
                      durability=durability, group=info.group, tracing=tracing)
    presence = Presence(redis=redis, settings=settings, info=info, runtime=runtime, connector=connector)
    janitor = Janitor(upkeep, retention=settings.retention, dead_after=settings.dead_after, durability=durability,
                      audit=settings.audit)
    runtime.check_if_stale = presence.ensure_fresh
    await start_once_reachable(redis, presence, settings.redis_partitions)
    jobs_loop = JobLoop(upkeep, tools=described, group=info.group, settings=settings,
                        schedules=info.schedules, durability=durability)
    job_loop = asyncio.create_task(jobs_loop.run())
    background = [asyncio.create_task(listen_for_cancels(redis, runtime)), asyncio.create_task(janitor.run()),
                  job_loop]
    if settings.notify.enabled:  # a worker without the secret leaves callbacks to those that have it
        background.append(asyncio.create_task(CallbackLoop(upkeep, settings.notify).run()))

    stopped = False

    async def on_shutdown(_: object) -> None:
        nonlocal stopped
        if stopped:  # once, whether arq's close called it or the stop below did
            return
        stopped = True
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await runtime.released()  # the locks of the last tools to end, before the connections close
        with contextlib.suppress(Exception):
            await upkeep.aclose(close_connection_pool=True)
        with contextlib.suppress(Exception):
            await presence.deregister()
        await lifecycle.shut_down()  # tools' shared resources (an OpenAPI import's HTTP client)
        runtime.close()

    def on_drain() -> None:
        log.info("stopping: no new work; draining %d running executions", runtime.running)
        job_loop.cancel()  # promotes no more jobs to a queue it no longer serves; other workers go on
        background.append(asyncio.create_task(presence.drain()))

    longest = max(t.timeout for t in described)
    worker = queue.build_worker(
        runtime.handle, pool=redis, worker_id=info.worker_id, group=info.group, concurrency=settings.concurrency,
        max_timeout=longest, drain_seconds=longest, on_shutdown=on_shutdown, on_drain=on_drain,
        admit=runtime.admit, forget=runtime.forget,
        durability=durability,
    )
    presence.leased = worker.leased
    collector.freeze_start_up()
    log.info("worker %s serving %d tools (%s) on queue %s (%d partitions)", info.worker_id, len(tools),
             ", ".join(t.name for t in tools), jobs.queue_name(info.group, 0), keys.partition_count())
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await worker.async_run()
    finally:
        try:
            await worker.close()
        except (RedisError, OSError) as exc:
            # arq's close deletes its status line (unused by Carmy; it expires by itself) before
            # it calls on_shutdown: with Redis out of reach it stopped there, with a traceback, and
            # left the tools' shared resources open and the last traces unexported.
            log.warning("stopping without Redis: %s", exc)
            await on_shutdown(None)
        if tracing is not None:
            tracing.shutdown()
