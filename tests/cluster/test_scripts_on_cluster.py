"""Every script of the store, run on a real Redis Cluster as the store's own tests call it.

The store's script tests run in a subprocess under ``tests/slotrecorder.py``, which keeps the
first calls of each script (keys and arguments, as its typed wrapper built them: the session's
``script_recordings``, ``tests.recordings``); each call is then run again here with ``EVAL`` on
the cluster fixture. What a call does to a cluster's state does not matter (it is out of its
test's context): only whether the cluster refuses it for its slots, which it does both for
declared keys in two slots and for a key the script names inside Lua in another slot than its
declared ones, the check the declared keys alone (``tests/carmy_worker/store/test_slots.py``)
cannot make. A script that fails earlier for another reason (its state is not there) may hide
such a key: the store's tests drive each script through its branches, and several calls of each
are run.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator

import pytest
import redis.cluster
from redis.exceptions import RedisClusterException, ResponseError

import carmy_worker.store
from bench.localcluster import LocalCluster
from carmy_worker.store.scripts import SCRIPTS
from tests.carmy_worker.store.test_slots import SPANNING
from tests.recordings import RECORDING_TIMEOUT_S, Calls, Recordings

SLOT_ERRORS = ("same slot", "non local key", "crossslot", "all keys must map", "same key slot")

# The first test here may be the session's first to ask for the recordings, made within its
# setup: over the per-test default of 60 s.
pytestmark = pytest.mark.timeout(RECORDING_TIMEOUT_S + 60)


@pytest.fixture(scope="module")
def cluster(redis_cluster: LocalCluster) -> Iterator[redis.cluster.RedisCluster]:
    host, _, port = redis_cluster.nodes.split(",")[0].rpartition(":")
    # A reply timeout: on a broken cluster the tests fail rather than hang (one did in CI).
    client = redis.cluster.RedisCluster(host=host, port=int(port), socket_timeout=10, socket_connect_timeout=5)
    yield client
    client.close()


def every_script() -> dict[str, str]:
    """The source of every script of the store, by name (each module imported, so listed)."""
    for module in pkgutil.iter_modules(carmy_worker.store.__path__):
        importlib.import_module(f"carmy_worker.store.{module.name}")
    return {name: script.source for name, script in SCRIPTS.items()}


def refused_for_slots(cluster: redis.cluster.RedisCluster, calls: Calls) -> dict[str, str]:
    """Each script the cluster refused a call of for its slots, with the refusal."""
    refused: dict[str, str] = {}
    sources = every_script()
    for name, made in calls.items():
        source = sources.get(name)
        if source is None:  # the tests' own scripts (scripts.py's tests)
            continue
        for redis_keys, args in made:
            try:
                cluster.execute_command("EVAL", source, len(redis_keys), *redis_keys, *args)
            except (RedisClusterException, ResponseError) as exc:
                if any(words in str(exc).lower() for words in SLOT_ERRORS):
                    refused[name] = str(exc)
                    break
    return refused


def test_every_script_runs_on_a_cluster_with_one_partition(cluster: redis.cluster.RedisCluster,
                                                          script_recordings: Recordings) -> None:
    calls = script_recordings[1].calls
    assert len(set(calls) & set(every_script())) >= 25  # the store's tests drove most scripts
    assert refused_for_slots(cluster, calls) == {}


def test_with_sixteen_partitions_no_script_is_refused(cluster: redis.cluster.RedisCluster,
                                                      script_recordings: Recordings) -> None:
    refused = refused_for_slots(cluster, script_recordings[16].calls)
    # Every script runs in one partition, the keys it names inside Lua built from that
    # partition's prefixes (architecture.md, section 3): SPANNING is empty, and so is this.
    assert set(refused) == SPANNING, refused
