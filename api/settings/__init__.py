"""Settings of the HTTP front end, read once from the environment at the entry point: the
lowest room of the API, which every other may import (``quotas``: each principal's limits;
``oauth``: the access tokens' issuer; ``webhooks``: the deliveries received, and their secrets)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping

import msgspec
from msgspec import Struct

from api.settings.oauth import OAuthSettings, oauth_from_env
from api.settings.quotas import Quotas, quotas_from_env
from api.settings.webhooks import StandardWebhooks, Webhook, parse_webhooks
from carmy_worker.settings import (
    DEFAULT_REDIS_URL,
    MAX_SECONDS,
    AuditSettings,
    NotifySettings,
    SettingsError,
    TracingSettings,
    audit_from_env,
    env_bool,
    env_choice,
    env_cluster_nodes,
    env_float,
    env_int,
    env_partitions,
    env_tracing,
    notify_from_env,
)

# The names a browser on this machine uses for a server bound to loopback, with any port.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` makes the API reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ApiKey(Struct, frozen=True, forbid_unknown_fields=True):
    """What one bearer token stands for (``CARMY_API_KEYS``)."""

    principal: str
    permissions: frozenset[str] = frozenset()


DEFAULT_DESCRIPTION = (
    "Tools run by Carmy workers, with timeouts, progress and safe retries "
    "(give a call _meta carmy/request_id to retry it safely)."
)


class ApiSettings(Struct, frozen=True, kw_only=True):
    """Settings of one API process (the README's Settings table). Build with ``from_env`` or directly in tests."""

    redis_url: str = DEFAULT_REDIS_URL
    redis_cluster_nodes: tuple[str, ...] = ()  # a Redis Cluster's seeds; () : redis_url names the server
    redis_partitions: int = 1  # partitions of the store's keys, the same in every process (store/partitions.py)
    host: str = "127.0.0.1"
    port: int = 8000
    server_name: str = "carmy"
    # What MCP clients show of this deployment (serverInfo's title and description).
    server_title: str = "Carmy"
    server_description: str = DEFAULT_DESCRIPTION
    api_keys: dict[str, ApiKey] | None = None  # token -> key; None: no authentication
    oauth: OAuthSettings | None = None  # access tokens of one issuer, besides (or instead of) API keys
    max_pending: int = 1000  # queued-or-running executions, across all API processes
    quotas: Quotas = Quotas()  # each principal's own limits (api/settings/quotas.py); none by default
    retention: int = 86400  # seconds final records and idempotency records are kept
    queue_timeout: float = 60.0  # seconds an execution may wait for a worker before it is dropped
    max_body: int = 1_048_576
    sse_keepalive: float = 15.0  # seconds between keep-alive comments on an idle stream
    dead_after: float = 3.0  # a worker silent this long is dead (matches the worker's heartbeat)
    catalog_refresh: float = 1.0  # seconds between catalog and liveness checks
    # HTTP hardening (see api/serving/server.py and api/guards/headers.py).
    header_timeout: float = 15.0  # seconds a connection may take to send a request's headers
    body_timeout: float = 30.0  # seconds a request's body may take, counted from the end of its headers
    max_header_bytes: int = 65536  # a request whose headers are larger is refused (431)
    security_headers: bool = False  # nosniff, frame-ancestors 'none', no-referrer, ...
    cors_origins: tuple[str, ...] = ()  # origins allowed by CORS; empty: CORS off
    # Host names the API answers to ("*": any); None: see hosts_allowed.
    allowed_hosts: tuple[str, ...] | None = None
    log_format: str = "json"  # "json" (one object a line) or "text"
    redis_connections: int = 16  # the pool's size; requests wait for a free one while Redis answers
    # Replicas that must acknowledge SUBMIT and imposed records (Redis WAIT), and for how long (ms).
    wait_replicas: int = 0
    wait_timeout: int = 500
    # The share of Redis's maxmemory kept for the work already accepted: new calls are refused
    # (STORE_FULL) once Redis uses the rest (carmy_worker/store/memory.py).
    redis_memory_headroom: float = 0.1
    # MCP tasks: how long a tools/call of a client that accepts tasks is followed before it
    # is answered with a task instead of its result.
    mcp_task_after: float = 2.0
    tracing: TracingSettings = TracingSettings()  # off: no span, and OpenTelemetry not imported
    # Jobs (POST /agent/jobs): how far ahead one may be due (s), how many unfinished jobs one
    # principal may have (0: no limit), how long a finished job and a dead letter are kept (s).
    jobs_horizon: int = 30 * 86400
    jobs_max_open: int = 10_000
    jobs_retention: int = 7 * 86400
    dead_letter_retention: int = 30 * 86400
    # The permission that lets a caller see everyone's jobs and retry failed ones; and whether
    # MCP lists the operator's tools (carmy_dead_letters) to callers that hold it.
    operator_permission: str = "carmy:operator"
    mcp_operator_tools: bool = False
    # Webhooks received at /agent/webhooks/{name} (api/settings/webhooks.py), secrets read at start.
    webhooks: dict[str, Webhook] = {}
    # Jobs' callbacks: without a secret, or for a host not allowed, a job's notify is refused.
    notify: NotifySettings = NotifySettings()
    # The audit trail: how much of it Redis keeps, and where it is also shipped (JSON lines).
    audit: AuditSettings = AuditSettings()
    # The operator console at /console (api/console/): off unless turned on; a session lasts
    # `console_session` seconds; its cookies are signed with `console_secret` (when '', a random
    # one shared through Redis); `console_secure_cookies` marks them Secure even over plain HTTP
    # (behind a proxy that terminates TLS: this process never trusts proxy headers).
    console: bool = False
    console_session: int = 3600
    console_secret: str = ""
    console_secure_cookies: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ApiSettings:
        env = os.environ if env is None else env
        settings = cls(
            redis_url=env.get("CARMY_REDIS_URL") or DEFAULT_REDIS_URL,
            redis_cluster_nodes=env_cluster_nodes(env),
            redis_partitions=env_partitions(env),
            host=env.get("CARMY_HOST") or "127.0.0.1",
            # asyncio takes a port modulo 65536: 70000 would be served on 4464, silently.
            port=env_int(env, "CARMY_PORT", 8000, minimum=0, maximum=65535),
            server_name=env.get("CARMY_SERVER_NAME") or "carmy",
            server_title=env.get("CARMY_SERVER_TITLE") or "Carmy",
            server_description=env.get("CARMY_SERVER_DESCRIPTION") or DEFAULT_DESCRIPTION,
            api_keys=parse_api_keys(env.get("CARMY_API_KEYS")),
            oauth=oauth_from_env(env),
            max_pending=env_int(env, "CARMY_MAX_PENDING", 1000),
            quotas=quotas_from_env(env),
            retention=env_int(env, "CARMY_RETENTION", 86400, maximum=MAX_SECONDS),
            queue_timeout=env_float(env, "CARMY_QUEUE_TIMEOUT", 60.0, maximum=MAX_SECONDS),
            header_timeout=env_float(env, "CARMY_HEADER_TIMEOUT", 15.0, maximum=MAX_SECONDS),
            body_timeout=env_float(env, "CARMY_BODY_TIMEOUT", 30.0, maximum=MAX_SECONDS),
            security_headers=env_bool(env, "CARMY_SECURITY_HEADERS", False),
            cors_origins=env_list(env, "CARMY_CORS_ORIGINS"),
            allowed_hosts=env_list(env, "CARMY_ALLOWED_HOSTS") or None,
            log_format=env_choice(env, "CARMY_LOG_FORMAT", ("json", "text")),
            # One is kept by the SUBMIT batch (store/batch.py): the other commands need one more.
            redis_connections=env_int(env, "CARMY_REDIS_CONNECTIONS", 16, minimum=2),
            wait_replicas=env_int(env, "CARMY_REDIS_WAIT_REPLICAS", 0, minimum=0),
            wait_timeout=env_int(env, "CARMY_REDIS_WAIT_TIMEOUT", 500, maximum=MAX_SECONDS * 1000),
            redis_memory_headroom=env_fraction(env, "CARMY_REDIS_MEMORY_HEADROOM", 0.1),
            mcp_task_after=env_float(env, "CARMY_MCP_TASK_AFTER", 2.0, maximum=MAX_SECONDS),
            tracing=env_tracing(env),
            jobs_horizon=env_int(env, "CARMY_JOBS_HORIZON", 30 * 86400, maximum=MAX_SECONDS),
            jobs_max_open=env_int(env, "CARMY_JOBS_MAX_OPEN", 10_000, minimum=0),
            jobs_retention=env_int(env, "CARMY_JOBS_RETENTION", 7 * 86400, maximum=MAX_SECONDS),
            dead_letter_retention=env_int(env, "CARMY_DEAD_LETTER_RETENTION", 30 * 86400, maximum=MAX_SECONDS),
            operator_permission=(env.get("CARMY_OPERATOR_PERMISSION") or "").strip() or "carmy:operator",
            mcp_operator_tools=env_bool(env, "CARMY_MCP_OPERATOR_TOOLS", False),
            webhooks=parse_webhooks(env.get("CARMY_WEBHOOKS"), env),
            notify=notify_from_env(env),
            audit=audit_from_env(env),
            console=env_bool(env, "CARMY_CONSOLE", False),
            console_session=env_int(env, "CARMY_CONSOLE_SESSION", 3600, minimum=60, maximum=MAX_SECONDS),
            console_secret=(env.get("CARMY_CONSOLE_SECRET") or "").strip(),
            console_secure_cookies=env_bool(env, "CARMY_CONSOLE_SECURE_COOKIES", False),
        )
        if settings.console_secret and len(settings.console_secret) < 32:
            raise SettingsError("CARMY_CONSOLE_SECRET must be at least 32 characters")
        for name, hook in settings.webhooks.items():
            # Past its event id's record, a delivery replayed within the tolerance would run again.
            verify = hook.config.verify
            if hook.config.event_id is None or not isinstance(verify, StandardWebhooks):
                continue
            kept_by, kept = (("CARMY_RETENTION", settings.retention) if hook.config.mode == "call"
                             else ("CARMY_JOBS_RETENTION", settings.jobs_retention))
            if verify.tolerance_s > kept:
                raise SettingsError(
                    f"CARMY_WEBHOOKS[{name!r}]: tolerance_s ({verify.tolerance_s}) is longer than its event ids "
                    f"are kept ({kept_by}, {kept} s): a delivery replayed after that would run again")
        keyed = [name for name, hook in settings.webhooks.items() if hook.config.auth == "api-key"]
        if keyed and not settings.authenticates:
            raise SettingsError(f"CARMY_WEBHOOKS[{keyed[0]!r}]: auth \"api-key\" needs CARMY_API_KEYS (or OAuth)")
        return settings

    def hosts_allowed(self) -> tuple[str, ...]:
        """``allowed_hosts``, or by default the loopback names when the API is bound to loopback
        (a browser on this machine is then its only possible client) and any host otherwise: a
        server reached from elsewhere is called by names it cannot know (service names, the
        proxy's public name, a pod's IP), and a wrong guess would refuse every call."""
        if self.allowed_hosts is not None:
            return self.allowed_hosts
        return (*LOOPBACK_HOSTS, self.host) if is_loopback(self.host) else ("*",)

    @property
    def authenticates(self) -> bool:
        """Whether callers must present an API key or an access token."""
        return self.api_keys is not None or self.oauth is not None


def env_fraction(env: Mapping[str, str], name: str, default: float) -> float:
    """A fraction from 0 up to, not including, 1."""
    value = env_float(env, name, default, zero_ok=True)
    if value >= 1:
        raise SettingsError(f"{name} must be at least 0 and below 1, got {value:g}")
    return value


def env_list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated setting; empty items are dropped."""
    return tuple(item.strip() for item in (env.get(name) or "").split(",") if item.strip())


def parse_api_keys(raw: str | None) -> dict[str, ApiKey] | None:
    """``{"<token>": {"principal": "...", "permissions": [...]}}``, or None when unset."""
    if raw is None or raw.strip() == "":
        return None
    try:
        keys = msgspec.json.decode(raw, type=dict[str, ApiKey])
    except msgspec.DecodeError as exc:
        raise SettingsError(f"CARMY_API_KEYS is not valid: {exc}") from None
    if not keys or any(len(token) < 16 for token in keys):
        raise SettingsError("CARMY_API_KEYS needs at least one token, each at least 16 characters")
    return keys
