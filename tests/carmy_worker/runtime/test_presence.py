"""What a worker publishes about its tools."""

from __future__ import annotations

from carmy_worker import Context, RetryPolicy, Toolbox
from carmy_worker.runtime.presence import describe
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
