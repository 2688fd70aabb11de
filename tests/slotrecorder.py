"""A pytest plugin (``-p tests.slotrecorder``) that names every key over ``CARMY_SLOT_PARTITIONS``
partitions and records, for each script the store runs, the hash slots of the keys each call
declared (``Script.command``: every way a script goes out builds its command there), as JSON in
``CARMY_SLOT_REPORT`` at the end of the session; with ``CARMY_SLOT_CALLS``, also the calls
themselves (a few of each script, msgpack), to be run again on a cluster
(``tests/cluster/test_scripts_on_cluster.py``). ``tests.recordings`` runs the store's script
tests under it, for ``tests/carmy_worker/store/test_slots.py`` and that module: a script whose
call spans two slots would be refused by a Redis Cluster (CROSSSLOT)."""

from __future__ import annotations

import json
import os
import secrets
from typing import Any

import msgspec
import pytest
from redis.crc import key_slot

from carmy_worker.store import keys
from carmy_worker.store.scripts import Script

_seen: dict[str, list[list[int]]] = {}
_calls: dict[str, list[tuple[list[Any], list[Any]]]] = {}
CALLS_KEPT = 8  # of each script, the first ones (besides one of each spread of slots)


def _recording(command: Any) -> Any:
    def record(self: Script, redis_keys: list[Any], args: list[Any]) -> tuple[Any, ...]:
        slots = sorted({key_slot(k if isinstance(k, bytes) else str(k).encode()) for k in redis_keys})
        calls = _seen.setdefault(self.name, [])
        kept = _calls.setdefault(self.name, [])
        if slots not in calls:  # every new spread of slots is kept, and the first few calls
            calls.append(slots)
            kept.append((list(redis_keys), list(args)))
        elif len(kept) < CALLS_KEPT:
            kept.append((list(redis_keys), list(args)))
        return command(self, redis_keys, args)  # type: ignore[no-any-return]
    return record


def _elsewhere(count: int) -> int:
    return 1 + secrets.randbelow(count - 1)


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("CARMY_SLOT_REPORT"):
        count = int(os.environ.get("CARMY_SLOT_PARTITIONS", "16"))
        keys.use_partitions(count)
        Script.command = _recording(Script.command)  # type: ignore[method-assign]
        if count > 1:
            # Ids drawn for no partition in particular avoid partition 0, whose slot the keys
            # that are not a function of an id share: a script that mixes both then spans two
            # slots on every call, not on fifteen calls in sixteen.
            drawn = keys._uuid4_in
            keys._uuid4_in = lambda partition: drawn(partition if partition is not None else _elsewhere(count))


def pytest_unconfigure(config: pytest.Config) -> None:
    report = os.environ.get("CARMY_SLOT_REPORT")
    if report:
        with open(report, "w") as out:
            json.dump(_seen, out)
    calls = os.environ.get("CARMY_SLOT_CALLS")
    if calls:
        with open(calls, "wb") as out:
            out.write(msgspec.msgpack.encode(_calls))
