"""The C heap of a serving process keeps what a call frees (``carmy_worker.heap``): the next
call's copies of a large payload land in pages already there, not in fresh ones that fault."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from api.app import create_app
from api.serving import server
from api.settings import ApiSettings
from carmy_worker import __main__ as worker_main
from carmy_worker import collector, heap, logs
from carmy_worker.store import keys

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

# One call's worth of copies of a 1 MiB payload (body, JSON, msgpack, Redis's protocol...),
# made and freed fifty times: the page faults per call, after five calls to warm up.
CALLS = """
import resource, sys
from carmy_worker import heap
if sys.argv[1] == "keep":
    assert heap.keep_freed_memory()
data = b"x" * (1 << 20)
def call():
    copies = [b"%d" % i + data for i in range(6)]
    del copies
for _ in range(5):
    call()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    call()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50)
"""


def faults_per_call(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", CALLS, mode], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"}, check=True)
    return float(done.stdout)


def test_a_serving_process_reuses_the_pages_a_large_call_freed() -> None:
    # glibc left to itself hands the 6 MiB back after each call and faults them in again:
    # about 1,500 faults (one per 4 KiB page) per call.
    left_alone = faults_per_call("default")
    kept = faults_per_call("keep")
    assert left_alone > 1000
    assert kept < 16


@pytest.mark.parametrize("environ", [
    {"MALLOC_TRIM_THRESHOLD_": "1048576"},
    {"MALLOC_MMAP_THRESHOLD_": "131072"},
    {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"},
])
def test_thresholds_the_user_set_are_left_as_they_are(environ: dict[str, str]) -> None:
    assert heap.set_by_user(environ)
    assert not heap.keep_freed_memory(environ)


def test_other_tunables_do_not_count_as_the_thresholds() -> None:
    assert not heap.set_by_user({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.top_pad=0",
                                 "MALLOC_ARENA_MAX": "2", "MALLOC_TOP_PAD_": "0"})


@pytest.fixture
def serving(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What a process does at start to serve, recorded instead of done (the collector's settings
    and the heap's are the test process's too)."""
    done: list[str] = []
    monkeypatch.setattr(collector, "for_serving", lambda: done.append("collector"))
    monkeypatch.setattr(heap, "keep_freed_memory", lambda: done.append("heap") or True)
    return done


def test_a_worker_keeps_the_memory_it_frees(serving: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_main, "run", lambda coro: coro.close())  # built, never served
    monkeypatch.setattr(logs, "configure", lambda log_format: None)  # the test process's logging stays
    assert worker_main.main(["examples.shop"]) == 0
    assert "heap" in serving


def test_the_api_keeps_the_memory_it_frees(serving: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    class Unserved:
        def __init__(self, config: object) -> None:
            pass

        def run(self) -> None:
            serving.append("served")

    monkeypatch.setattr(server, "Server", Unserved)
    # The session's partition count (create_app names keys over the settings' count).
    settings = ApiSettings.from_env({"CARMY_REDIS_PARTITIONS": str(keys.partition_count())})
    server.run(create_app(settings), settings)
    assert serving == ["collector", "heap", "served"]
