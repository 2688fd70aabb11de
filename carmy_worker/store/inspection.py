"""One execution as an operator inspects it (the console's page of it): what its hash says of its
life and its record, whoever it belongs to. Unlike ``reads.Reads.lookup``, which a caller uses and
which answers only its owner, this is for those who may see everyone's; the API decides who."""

from __future__ import annotations

from msgspec import Struct
from redis.asyncio import Redis

from carmy_worker.store import keys
from carmy_worker.wire import Record, record_decoder

FIELDS = ["tool", "state", "rid", "job", "principal", "effect", "via", "worker", "queued_at", "started_at",
          "message", "message_at", "ended_at"]


class Inspected(Struct, kw_only=True):
    """An execution's hash and record. Times are Redis's clock, Unix ms; ``message``: the newest
    progress message (Redis keeps no older one); ``record``: None until it has finished."""

    execution_id: str
    tool: str
    state: str  # queued, running or done
    request_id: str | None
    job_id: str | None
    principal: str | None
    effect: str | None
    via: str | None
    worker: str | None
    queued_ms: int | None
    started_ms: int | None
    message: str | None
    message_ms: int | None
    ended_ms: int | None
    record: Record | None


async def inspect(redis: Redis, exec_id: str) -> Inspected | None:
    """``exec_id``'s hash and record, or None once its hash has expired (``CARMY_RETENTION``)."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.execution(exec_id), FIELDS)
        pipe.get(keys.record(exec_id))
        values, raw = await pipe.execute()
    f = {name: None if value is None else value.decode(errors="replace") for name, value in zip(FIELDS, values,
                                                                                                strict=True)}
    if f["tool"] is None:
        return None

    def ms(name: str) -> int | None:
        value = f[name]
        return int(value) if value and value.isdigit() else None

    record = None if raw is None else record_decoder.decode(raw)
    return Inspected(
        execution_id=exec_id, tool=f["tool"], state="done" if record is not None else f["state"] or "queued",
        request_id=f["rid"] or None, job_id=f["job"] or None, principal=f["principal"] or None,
        effect=f["effect"] or None, via=f["via"] or None, worker=f["worker"] or None, queued_ms=ms("queued_at"),
        started_ms=ms("started_at"), message=f["message"], message_ms=ms("message_at"), ended_ms=ms("ended_at"),
        record=record,
    )
