"""What a worker publishes about itself: its tools, and an id that names its process."""

from __future__ import annotations

import os

from carmy_worker import Context, RetryPolicy, Toolbox
from carmy_worker.runtime.presence import describe, new_worker_id, pid_of
from carmy_worker.settings import WorkerSettings
from carmy_worker.wire import WorkerInfo, msgpack_encoder, worker_info_decoder


def test_each_tools_retry_policy_is_published() -> None:
    box = Toolbox()
    patient = RetryPolicy(max_attempts=9, backoff=2.5, max_backoff=60)

    @box.tool(effect="write", retry=patient)
    def sync(ctx: Context) -> None:
        """Sync, tried again up to nine times."""

    @box.tool(effect="read")
    def look(ctx: Context) -> None:
        """Look, with the default policy."""

    described = describe(list(box), WorkerSettings())
    assert [(t.spec.name, t.retry) for t in described] == [("look", RetryPolicy()), ("sync", patient)]
    info = WorkerInfo(worker_id="w", started_ms=0, tools=described, group="g")
    assert worker_info_decoder.decode(msgpack_encoder.encode(info)).tools[1].retry == patient


def test_a_worker_id_names_its_process() -> None:
    assert pid_of(new_worker_id()) == os.getpid()
    assert pid_of("build-host-7-42-a1b2c3") == 42  # a host name with dashes
    assert pid_of("w") is None and pid_of("") is None and pid_of("host-x1-a1b2c3") is None
