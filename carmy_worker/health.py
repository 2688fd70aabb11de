"""``python -m carmy_worker.health``: is a worker on this host alive? For container health checks.

Exit 0 when a worker process on this host heartbeated within ``dead_after`` seconds (in every
partition: ``store.roster``), else exit 1 with one line on stderr saying why. It asks Redis, not
the process: the heartbeat is what the API and the janitor go by, so a worker whose heartbeat
stopped is dead to them whatever its process is doing. Each Redis call gives up after 2 s, so a check never hangs.
"""

from __future__ import annotations

import socket
import sys
from typing import cast

import msgspec
import redis

from carmy_worker.settings import SettingsError, WorkerSettings
from carmy_worker.store import keys
from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.roster import SyncLiveness
from carmy_worker.wire import worker_info_decoder

TIMEOUT = 2.0  # seconds, per connect and per reply


def check(settings: WorkerSettings, host: str) -> str | None:
    """None when a worker on ``host`` is alive, else the reason it is not."""
    try:
        connector = RedisConnector(settings.redis_url, settings.redis_cluster_nodes)
        client = connector.sync_client(socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT)
    except SettingsError as exc:
        return str(exc)
    try:
        # Scores are compared with Redis's clock, as the API does: this host's may differ.
        rosters = SyncLiveness(client, dead_after=settings.dead_after).rosters()
        live = [w for w in rosters[0].last_seen if rosters[0].alive(w)]
        # The sync client's stubs type every reply as "maybe awaitable".
        infos = cast("list[bytes | None]", client.mget([keys.worker(w) for w in live])) if live else []
    except redis.RedisError as exc:
        return f"cannot query Redis: {exc}"
    finally:
        client.close()
    ours = [w for w, raw in zip(live, infos, strict=True) if _host(raw) == host]
    # Alive only if every partition's roster says so: a worker whose beats no longer reach a
    # partition has its work there reaped by that partition's janitor.
    missed = {w: [p for p, roster in enumerate(rosters) if not roster.alive(w)] for w in ours}
    if any(not partitions for partitions in missed.values()):
        return None
    if missed:
        worker_id, partitions = next(iter(missed.items()))
        return (f"worker {worker_id} on {host} has not heartbeated in the last {settings.dead_after:g} s in "
                f"partition(s) {', '.join(map(str, partitions))} of {len(rosters)}")
    return (f"no worker on {host} has heartbeated in the last {settings.dead_after:g} s "
            f"({len(live)} live elsewhere)")


def _host(raw: bytes | None) -> str | None:
    try:
        return None if raw is None else worker_info_decoder.decode(raw).host
    except msgspec.DecodeError:
        return None  # another version's record: not ours to judge


def main() -> int:
    try:
        settings = WorkerSettings.from_env()
    except SettingsError as exc:
        reason: str | None = str(exc)
    else:
        keys.use_partitions(settings.redis_partitions)  # before any key is named
        reason = check(settings, socket.gethostname())
    if reason is None:
        return 0
    print(f"carmy_worker.health: {reason}", file=sys.stderr)
    return 1  # not 2: Docker reserves it


if __name__ == "__main__":
    sys.exit(main())
