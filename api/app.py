"""The application factory. Everything the app needs is built here from one settings object,
and started and stopped by the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route, request_response
from starlette.types import ASGIApp

from api.calling.audit import Audit
from api.calling.calls import Calls
from api.calling.catalog import Catalog
from api.calling.executions import Executions
from api.calling.jobs import Jobs
from api.calling.schedules import Schedules
from api.console.entrance import refused_by_browser_guard
from api.console.live import Sampler
from api.console.routes import ConsoleServices, console_routes
from api.endpoints.audit import AUDIT_PATH, AuditRoutes
from api.endpoints.discovery import endpoints
from api.endpoints.execute import ExecuteEndpoint
from api.endpoints.jobs import JOBS_PATH, JobRoutes
from api.endpoints.lookup import ExecutionRoutes
from api.endpoints.ops import ApiMetrics, Ops
from api.endpoints.shortcut import CarmyApp
from api.endpoints.webhooks import WEBHOOKS_PATH, WebhookEndpoint
from api.events.hub import EventHub
from api.events.sink import audit_sink
from api.guards.auth import ApiKeys, Authenticator, RequireAuth
from api.guards.browser import BrowserGuard, RequireJson
from api.guards.headers import middleware
from api.guards.oauth import ProtectedResources, TokenVerifier, key_source
from api.http.methods import by_method
from api.mcp import MCP_PATH, McpServer
from api.serving.stopping import at_grace_end
from api.settings import ApiSettings
from carmy_worker.store import keys, partitions
from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.durable import Durability
from carmy_worker.store.janitor import Janitor
from carmy_worker.store.memory import StoreMemory
from carmy_worker.tracing import start as start_tracing

# How long a request may wait for one of the pool's connections while Redis is reachable: a
# burst makes calls slower, not refused (an unreachable Redis is told at once, see StorePool).
POOL_WAIT_S = 10.0
# Redis is unreachable when a connection is not accepted within this, or a reply takes longer
# than REPLY_TIMEOUT_S (plus the WAIT for replicas, when asked for): STORE_UNAVAILABLE.
CONNECT_TIMEOUT_S = 0.5
REPLY_TIMEOUT_S = 1.0
EXECUTE_PATH = "/agent/execute"


def connect(settings: ApiSettings, connector: RedisConnector) -> Redis:
    """The process's bounded pool (``CARMY_REDIS_CONNECTIONS``): waiting executions hold no connection."""
    return connector.store_client(
        max_connections=settings.redis_connections, wait=POOL_WAIT_S, socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=REPLY_TIMEOUT_S + settings.wait_timeout / 1000 * bool(settings.wait_replicas),
    )


def create_app(settings: ApiSettings | None = None) -> Starlette:
    """The carmy/1 HTTP app, with MCP at ``/mcp``. Serve it with uvicorn, or mount it in a host app.

    Its background work (catalog refresh, shared pub/sub connection, janitor, Redis's memory
    reading, MCP's session manager) runs in its lifespan: when mounted, enter
    ``app.router.lifespan_context(app)`` from the host's own lifespan (see the README).
    """
    settings = settings or ApiSettings.from_env()
    keys.use_partitions(settings.redis_partitions)  # before any key is named
    connector = RedisConnector(settings.redis_url, settings.redis_cluster_nodes)
    redis = connect(settings, connector)
    catalog = Catalog(redis=redis, server_name=settings.server_name, dead_after=settings.dead_after,
                      refresh_interval=settings.catalog_refresh,
                      webhook_tools={name: hook.config.tool for name, hook in settings.webhooks.items()})
    # The pub/sub connection waits for messages indefinitely: no read timeout on it.
    listener = connector.client(socket_connect_timeout=CONNECT_TIMEOUT_S)
    hub = EventHub(listener, on_broadcast={keys.CATALOG_CHANNEL: catalog.notify})
    durability = Durability(settings.wait_replicas, settings.wait_timeout)
    memory = StoreMemory(redis, headroom=settings.redis_memory_headroom)
    executions = Executions(redis, settings, durability, memory, waiting=hub.waiting)
    janitor = Janitor(redis, retention=settings.retention, dead_after=settings.dead_after, durability=durability,
                      audit=settings.audit)
    api_metrics = ApiMetrics()
    ops = Ops(redis, catalog, api_metrics, memory)
    calls = Calls(catalog=catalog, executions=executions, hub=hub)
    tracing = start_tracing(settings.tracing, service="carmy-api")
    execute = ExecuteEndpoint(settings=settings, calls=calls, metrics=api_metrics, tracing=tracing)
    lookup = ExecutionRoutes(settings=settings, calls=calls)
    jobs = Jobs(redis, settings, calls, durability=durability, memory=memory)
    job_routes = JobRoutes(settings=settings, jobs=jobs, schedules=Schedules(redis, catalog))
    audit = Audit(redis, jobs)
    audit_routes = AuditRoutes(audit=audit)
    # CARMY_AUDIT_SINK: entries shipped as JSON lines, each by one API process of all.
    sink = audit_sink(connector, settings.audit.sink, connect_timeout=CONNECT_TIMEOUT_S) \
        if settings.audit.sink else None
    mcp = McpServer(settings=settings, calls=calls, jobs=jobs, audit=audit, tracing=tracing)
    discovery, tools = endpoints(catalog)
    # The console overview's one reading of Redis a second; it runs only with the console on.
    sampler = Sampler(redis, dead_after=settings.dead_after)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Another partition count than the store's would look for executions where they are not:
        # refuse to start (PartitionsDisagree). A Redis not there yet does not hold start-up up.
        try:
            await asyncio.wait_for(partitions.agree(redis, settings.redis_partitions), 2.0)
        except partitions.PartitionsDisagree:
            await listener.aclose()
            await redis.aclose(close_connection_pool=True)
            raise
        except (RedisError, OSError, TimeoutError):
            pass
        await hub.start()
        # At the end of a stop's grace, the calls still waiting answer SERVER_STOPPING.
        forget_hub = at_grace_end(hub.stop_waiting)
        tasks = [asyncio.create_task(catalog.run()), asyncio.create_task(janitor.run()),
                 asyncio.create_task(memory.run()), asyncio.create_task(executions.recheck.run())]
        if sink is not None:
            tasks.append(asyncio.create_task(sink.run()))
        if settings.console:
            tasks.append(asyncio.create_task(sampler.run()))
        # Serve with the catalog already known when Redis is there; never block start-up on it.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(catalog.refresh(), 2.0)
        try:
            async with mcp.lifespan():
                yield
        finally:
            forget_hub()
            execute.log_lines.run()  # the last requests' log lines
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await hub.close()
            if sink is not None:
                await sink.close()
            await listener.aclose()
            await redis.aclose(close_connection_pool=True)
            if tracing is not None:
                tracing.shutdown()

    auth = authenticator(settings)
    # Deliveries carry no key unless their webhook asks for one (api/endpoints/webhooks.py).
    webhooks = WebhookEndpoint(settings=settings, execute=execute, jobs=jobs, auth=auth)

    def guarded(endpoint: ASGIApp, *, mcp: bool = False) -> ASGIApp:
        return RequireAuth(endpoint, auth, mcp=mcp)

    execute_route = guarded(RequireJson(execute))
    # The operator console (CARMY_CONSOLE): without it, no route under /console exists at all.
    console = console_routes(ConsoleServices(settings=settings, redis=redis, auth=auth, catalog=catalog,
                                             jobs=jobs, sampler=sampler)) \
        if settings.console else []
    return CarmyApp(
        # POST /agent/execute skips Starlette's router and error layers (api/endpoints/shortcut.py says why).
        shortcut_path=EXECUTE_PATH, shortcut=execute_route,
        routes=[
            Route("/.well-known/agent", discovery, methods=["GET"]),
            Route("/agent/tools", guarded(request_response(tools)), methods=["GET"]),
            Route(EXECUTE_PATH, execute_route, methods=["POST"]),
            # A path that takes two methods is one route, so that a 405's Allow names both.
            by_method("/agent/executions/{execution_id}", {"GET": guarded(request_response(lookup.get)),
                                                           "DELETE": guarded(request_response(lookup.delete))}),
            Route("/agent/executions/{execution_id}/events", guarded(lookup.events), methods=["GET"]),
            by_method(JOBS_PATH, {"POST": guarded(RequireJson(job_routes.create)),
                                  "GET": guarded(request_response(job_routes.list))}),
            by_method(JOBS_PATH + "/{job_id}", {"GET": guarded(request_response(job_routes.get)),
                                                "DELETE": guarded(request_response(job_routes.delete))}),
            # No body, so no RequireJson: a page of another site is refused by its Origin (BrowserGuard).
            Route(JOBS_PATH + "/{job_id}/retry", guarded(request_response(job_routes.retry)), methods=["POST"]),
            Route(JOBS_PATH + "/{job_id}/purge", guarded(request_response(job_routes.purge)), methods=["POST"]),
            Route("/agent/schedules", guarded(request_response(job_routes.list_schedules)), methods=["GET"]),
            Route(AUDIT_PATH, guarded(request_response(audit_routes.list)), methods=["GET"]),
            Route(WEBHOOKS_PATH + "/{name}", webhooks, methods=["POST"]),
            # Every method: the MCP server answers 405 itself.
            Route(MCP_PATH, guarded(RequireJson(mcp.asgi), mcp=True)),
            Route("/health", ops.health, methods=["GET"]),
            Route("/ready", ops.ready, methods=["GET"]),
            Route("/metrics", guarded(request_response(ops.metrics_text)), methods=["GET"]),
            *(auth.resources.routes() if auth is not None and auth.resources is not None else ()),
            *console,
        ],
        # Innermost, the guard: the CORS layer answers an allowed origin's preflight before it,
        # and its refusals carry the security and CORS headers like any other answer.
        middleware=[*middleware(settings), Middleware(BrowserGuard, settings,
                                                      refused_by_browser_guard if settings.console else None)],
        lifespan=lifespan,
    )


def authenticator(settings: ApiSettings) -> Authenticator | None:
    """API keys and OAuth as configured; None when neither is (every request passes)."""
    if not settings.authenticates:
        return None
    keys = ApiKeys(settings.api_keys) if settings.api_keys is not None else None
    if settings.oauth is None:
        return Authenticator(keys)
    tokens = TokenVerifier(settings.oauth, key_source(settings.oauth))
    return Authenticator(keys, tokens, ProtectedResources(settings.oauth, name=settings.server_title))
