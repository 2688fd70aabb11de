"""``python -m api``: serve the carmy/1 front end with uvicorn."""

from __future__ import annotations

import logging
import sys

import uvicorn

from api.app import create_app
from api.settings import ApiSettings
from carmy_worker.settings import SettingsError


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = ApiSettings.from_env()
    except SettingsError as exc:
        print(f"api: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        server_header=False,
        # Close connections that send nothing, and cap what a client can make us buffer.
        timeout_keep_alive=5,
        h11_max_incomplete_event_size=64 * 1024,
        timeout_graceful_shutdown=30,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
