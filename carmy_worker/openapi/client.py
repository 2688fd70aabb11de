"""The one pooled HTTP client of a worker process, shared by every tool an OpenAPI import
registers: connections to an upstream are kept alive across calls. Opened on first use (in the
worker's event loop), closed when the worker stops (``sdk.lifecycle``)."""

from __future__ import annotations

import httpx

from carmy_worker.sdk import lifecycle

LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=30)

_client: httpx.AsyncClient | None = None


def shared() -> httpx.AsyncClient:
    """The process's client. It follows no redirect (a 3xx could point anywhere), and reads no
    proxy, ``.netrc`` or certificate setting from the environment: an upstream is called as
    configured, nothing else."""
    global _client
    if _client is None or _client.is_closed:
        _client = httpx.AsyncClient(follow_redirects=False, trust_env=False, limits=LIMITS, timeout=None)
        lifecycle.on_shutdown(_client.aclose)
    return _client
