"""``python -m api``: serve the carmy/1 front end with uvicorn."""

from __future__ import annotations

import sys

from api.app import create_app
from api.server import run
from api.settings import ApiSettings
from carmy_worker import logs
from carmy_worker.settings import SettingsError


def main() -> int:
    try:
        settings = ApiSettings.from_env()
    except SettingsError as exc:
        print(f"api: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_format)
    run(create_app(settings), settings)  # uvicorn, hardened: see api/server.py
    return 0


if __name__ == "__main__":
    sys.exit(main())
