"""``python -m api``: serve the carmy/1 front end with uvicorn."""

from __future__ import annotations

import asyncio
import logging
import sys

from redis.exceptions import RedisError

from api.app import create_app
from api.serving.server import run
from api.settings import ApiSettings
from carmy_worker import logs
from carmy_worker.settings import SettingsError
from carmy_worker.store import partitions
from carmy_worker.store.connect import RedisConnector


def main() -> int:
    try:
        settings = ApiSettings.from_env()
        logs.configure(settings.log_format)  # before anything that may log
        app = create_app(settings)  # builds clients without connecting: refuses an unusable CARMY_REDIS_URL
    except SettingsError as exc:
        print(f"api: {exc}", file=sys.stderr)
        return 2
    refused = asyncio.run(partitions_refused(settings))
    if refused is not None:  # said here, in a line: the app's start-up would bury it in a traceback
        print(f"api: {refused}", file=sys.stderr)
        return 2
    if "*" in settings.hosts_allowed() and not settings.authenticates:
        # DNS rebinding then reaches every tool: a page whose name resolves to this server is
        # "same origin" with it, and needs no key.
        logging.getLogger("carmy.api").warning(
            "any Host is accepted (CARMY_ALLOWED_HOSTS) and no API key or access token is required (CARMY_API_KEYS, "
            "CARMY_OAUTH_ISSUER): a web page "
            "opened by a browser that can reach this server can call its tools; set one of them")
    run(app, settings)  # uvicorn, hardened: see api/serving/server.py
    return 0


async def partitions_refused(settings: ApiSettings) -> str | None:
    """Why the store refuses this process's ``CARMY_REDIS_PARTITIONS`` (``partitions.agree``), or
    None; None too when Redis cannot be reached yet (the app checks again as it starts)."""
    client = RedisConnector(settings.redis_url, settings.redis_cluster_nodes).client(socket_connect_timeout=1.0)
    try:
        await asyncio.wait_for(partitions.agree(client, settings.redis_partitions), 2.0)
    except partitions.PartitionsDisagree as exc:
        return str(exc)
    except (RedisError, OSError, TimeoutError):
        return None
    finally:
        await client.aclose()
    return None


if __name__ == "__main__":
    sys.exit(main())
