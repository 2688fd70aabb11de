"""Settings, read from the environment once at the entry point and passed down.

Constructors elsewhere never read the environment, so tests build settings directly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from msgspec import Struct

from carmy_worker.wire import is_digits

DEFAULT_REDIS_URL = "redis://localhost:6379/0"

# The longest any duration setting may be, in seconds: a century. Longer is a typo, and past
# about 2.9e8 years its milliseconds no longer fit Redis's 64-bit integers (1e20 s made every
# SUBMIT fail).
MAX_SECONDS = 100 * 365 * 86400
MAX_TOOL_TIMEOUT = 86400  # a tool's own ``timeout`` (sdk.definition), and CARMY_DEFAULT_TIMEOUT
MAX_CONCURRENCY = 1_000_000  # a worker's slots; its info carries the number as a 64-bit integer


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names it."""


def env_int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 1,
            maximum: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise SettingsError(f"{name} must be at most {maximum}, got {value}")
    return value


def env_float(env: Mapping[str, str], name: str, default: float, *, zero_ok: bool = False,
              maximum: float | None = None) -> float:
    """A positive number of ``name`` (``zero_ok``: or 0, where 0 means "none"), at most ``maximum``."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number, got {raw!r}") from None
    in_range = value >= 0 if zero_ok else value > 0  # NaN is neither
    if not in_range or value == float("inf"):
        raise SettingsError(f"{name} must be {'0 or ' if zero_ok else ''}a positive number, got {raw!r}")
    if maximum is not None and value > maximum:
        raise SettingsError(f"{name} must be at most {maximum:g}, got {raw!r}")
    return value


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name} must be true or false, got {raw!r}")


def env_choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``; the first is the default."""
    raw = (env.get(name) or "").strip().lower() or choices[0]
    if raw not in choices:
        raise SettingsError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


def env_cluster_nodes(env: Mapping[str, str]) -> tuple[str, ...]:
    """``CARMY_REDIS_CLUSTER_NODES``: seed nodes of a Redis Cluster, comma-separated ``host:port``
    (``[::1]:7000`` for IPv6); none (the default) means no cluster: ``CARMY_REDIS_URL`` names the
    server. With seeds, ``CARMY_REDIS_URL`` still gives the password (its userinfo), TLS
    (``rediss://``) and its query's connection options, applied to every node
    (``carmy_worker.store.connect``)."""
    raw = env.get("CARMY_REDIS_CLUSTER_NODES") or ""
    nodes = tuple(item.strip() for item in raw.split(",") if item.strip())
    for node in nodes:
        host, _, port = node.rpartition(":")
        if not host.strip("[]") or not is_digits(port) or not 0 < int(port) < 65536:
            raise SettingsError(f"CARMY_REDIS_CLUSTER_NODES must be host:port,host:port,..., got {node!r}")
    return nodes


# The most partitions a deployment may use (each worker keeps a blocking connection per partition).
SUPPORTED_PARTITIONS = 16


def env_partitions(env: Mapping[str, str]) -> int:
    """``CARMY_REDIS_PARTITIONS``: how many partitions the store's keys are spread over: 16 on a
    Redis Cluster (``CARMY_REDIS_CLUSTER_NODES``), so that the work spreads over its primaries;
    1 on a single Redis or Sentinel, where one core runs every script anyway."""
    default = 16 if env_cluster_nodes(env) else 1  # a value with no node in it (",") is no cluster
    count = env_int(env, "CARMY_REDIS_PARTITIONS", default)
    if count > SUPPORTED_PARTITIONS:
        raise SettingsError(f"CARMY_REDIS_PARTITIONS must be at most {SUPPORTED_PARTITIONS}, got {count}")
    return count


class TracingSettings(Struct, frozen=True):
    """``CARMY_TRACING``: where spans go (``carmy_worker.tracing``). Nowhere (``off``, the
    default), over OTLP/HTTP (``otlp``: the exporter reads the standard ``OTEL_EXPORTER_OTLP_*``
    variables), or one JSON object a line appended to ``path`` (``file:<path>``)."""

    mode: Literal["off", "otlp", "file"] = "off"
    path: str = ""


def env_tracing(env: Mapping[str, str]) -> TracingSettings:
    raw = (env.get("CARMY_TRACING") or "").strip()
    if raw.lower() in ("", "off"):
        return TracingSettings()
    if raw.lower() == "otlp":
        return TracingSettings("otlp")
    if raw.startswith("file:") and raw[5:]:
        return TracingSettings("file", raw[5:])
    raise SettingsError(f"CARMY_TRACING must be off, otlp or file:<path>, got {raw!r}")


class NotifySettings(Struct, frozen=True, kw_only=True):
    """Jobs' callbacks (docs/protocol.md, "Callbacks"), the same settings for the API (which
    refuses a ``notify`` it could not honour) and the workers (which deliver them).

    ``secret``: ``CARMY_NOTIFY_SECRET``, ``whsec_`` + base64, the Standard Webhooks signing key
    ('' : callbacks are off). ``hosts``: ``CARMY_NOTIFY_HOSTS``, the host names a callback may
    call (``*`` any; none by default). ``allow_private``: ``CARMY_NOTIFY_ALLOW_PRIVATE``, whether
    addresses that are not globally routable (loopback, private, link-local…) may be called.
    ``window``: ``CARMY_NOTIFY_WINDOW``, seconds a callback is retried for."""

    secret: str = ""
    hosts: tuple[str, ...] = ()
    allow_private: bool = False
    window: int = 86400

    @property
    def enabled(self) -> bool:
        return bool(self.secret)

    def allows_host(self, host: str) -> bool:
        return "*" in self.hosts or host.lower().rstrip(".") in self.hosts


def notify_from_env(env: Mapping[str, str]) -> NotifySettings:
    secret = (env.get("CARMY_NOTIFY_SECRET") or "").strip()
    if secret:
        from carmy_worker import signatures  # imported where it is needed: settings import nothing else

        try:
            key = signatures.key_of(secret)
        except ValueError:
            key = b""
        if not secret.startswith(signatures.PREFIX) or len(key) < 16:
            raise SettingsError("CARMY_NOTIFY_SECRET must be whsec_ followed by at least 16 bytes in base64")
    hosts = tuple(h.strip().lower().rstrip(".") for h in (env.get("CARMY_NOTIFY_HOSTS") or "").split(",") if h.strip())
    return NotifySettings(secret=secret, hosts=hosts, allow_private=env_bool(env, "CARMY_NOTIFY_ALLOW_PRIVATE", False),
                          window=env_int(env, "CARMY_NOTIFY_WINDOW", 86400, maximum=MAX_SECONDS))


class AuditSettings(Struct, frozen=True, kw_only=True):
    """The audit trail (docs/protocol.md, "Audit"): one entry per finished execution, in one
    Redis stream that every janitor trims to ``max_entries`` (``CARMY_AUDIT_MAX_ENTRIES``) and to
    ``retention`` seconds (``CARMY_AUDIT_RETENTION``). ``sink`` (API processes only,
    ``CARMY_AUDIT_SINK``): where the entries are also written as JSON lines, once each across
    the API replicas: nowhere (''), ``stdout``, or ``file:<path>``."""

    max_entries: int = 100_000
    retention: int = 7 * 86400
    sink: str = ""


def audit_from_env(env: Mapping[str, str]) -> AuditSettings:
    sink = (env.get("CARMY_AUDIT_SINK") or "").strip()
    if sink.lower() in ("", "off"):
        sink = ""
    elif sink.lower() == "stdout":
        sink = "stdout"
    elif not (sink.startswith("file:") and sink[5:]):
        raise SettingsError(f"CARMY_AUDIT_SINK must be off, stdout or file:<path>, got {sink!r}")
    return AuditSettings(max_entries=env_int(env, "CARMY_AUDIT_MAX_ENTRIES", 100_000, minimum=100),
                         retention=env_int(env, "CARMY_AUDIT_RETENTION", 7 * 86400, minimum=60, maximum=MAX_SECONDS),
                         sink=sink)


class WorkerSettings(Struct, frozen=True, kw_only=True):
    """Settings of one worker process (the README's Settings table)."""

    redis_url: str = DEFAULT_REDIS_URL
    redis_cluster_nodes: tuple[str, ...] = ()  # a Redis Cluster's seeds; () : redis_url names the server
    redis_partitions: int = 1  # partitions of the store's keys, the same in every process (store/partitions.py)
    concurrency: int = 16  # executions at once in this process
    default_timeout: float = 30.0  # seconds, for tools that set none
    retention: int = 86400  # seconds final records are kept
    # Liveness: a heartbeat every `heartbeat` s; a worker silent for `dead_after` s is dead.
    heartbeat: float = 1.0
    dead_after: float = 3.0
    log_format: str = "json"  # "json" (one object a line) or "text"
    # Bytes of JSON a tool's result (or its error's details) may take; beyond it, INVALID_OUTPUT.
    max_result_bytes: int = 1024 * 1024
    # Replicas that must acknowledge CLAIM, SETTLE and imposed records (Redis WAIT), and for how long (ms).
    wait_replicas: int = 0
    wait_timeout: int = 500
    tracing: TracingSettings = TracingSettings()
    # Seconds a finished job is kept, and a dead-lettered one (for jobs its schedules queue; the
    # API's settings of the same names apply to the jobs it creates).
    jobs_retention: int = 7 * 86400
    dead_letter_retention: int = 30 * 86400
    notify: NotifySettings = NotifySettings()
    audit: AuditSettings = AuditSettings()  # the janitor trims the audit trail to it

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerSettings:
        env = os.environ if env is None else env
        return cls(
            redis_url=env.get("CARMY_REDIS_URL") or DEFAULT_REDIS_URL,
            redis_cluster_nodes=env_cluster_nodes(env),
            redis_partitions=env_partitions(env),
            concurrency=env_int(env, "CARMY_CONCURRENCY", 16, maximum=MAX_CONCURRENCY),
            default_timeout=env_float(env, "CARMY_DEFAULT_TIMEOUT", 30.0, maximum=MAX_TOOL_TIMEOUT),
            retention=env_int(env, "CARMY_RETENTION", 86400, maximum=MAX_SECONDS),
            log_format=env_choice(env, "CARMY_LOG_FORMAT", ("json", "text")),
            max_result_bytes=env_int(env, "CARMY_MAX_RESULT_BYTES", 1024 * 1024),
            wait_replicas=env_int(env, "CARMY_REDIS_WAIT_REPLICAS", 0, minimum=0),
            wait_timeout=env_int(env, "CARMY_REDIS_WAIT_TIMEOUT", 500, maximum=MAX_SECONDS * 1000),
            tracing=env_tracing(env),
            jobs_retention=env_int(env, "CARMY_JOBS_RETENTION", 7 * 86400, maximum=MAX_SECONDS),
            dead_letter_retention=env_int(env, "CARMY_DEAD_LETTER_RETENTION", 30 * 86400, maximum=MAX_SECONDS),
            notify=notify_from_env(env),
            audit=audit_from_env(env),
        )
