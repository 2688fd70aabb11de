"""The queue's layout in Redis: where a job of an execution lives and how it is encoded.

The API writes jobs itself, inside the script that admits them (``store.submit``), and the
workers' arq reads them, so this layout is exactly the one ``ArqRedis.enqueue_job`` writes.
It is spelled out here rather than imported so that the API never imports arq;
``carmy_worker.runtime.queue`` checks at import time that arq still agrees, and
``tests/carmy_worker/runtime/test_arq_surface.py`` pins it.
"""

from __future__ import annotations

import msgspec

FUNCTION = "carmy_execute"  # the arq function every job calls
JOB_KEY_PREFIX = "arq:job:"  # arq.constants.job_key_prefix
IN_PROGRESS_KEY_PREFIX = "arq:in-progress:"  # arq.constants.in_progress_key_prefix
RETRY_KEY_PREFIX = "arq:retry:"  # arq.constants.retry_key_prefix: arq counts a job's runs here

_encoder = msgspec.msgpack.Encoder()


def queue_name(group: str) -> str:
    """The queue (a sorted set of job ids) of a group of workers serving the same catalog."""
    return f"carmy:queue:{group}"


def wake_channel(queue: str) -> str:
    """Published to when a job is queued, so idle workers look at once instead of polling."""
    return queue + ":wake"


def job_key(exec_id: str) -> str:
    return JOB_KEY_PREFIX + exec_id


def in_progress_key(exec_id: str) -> str:
    """A worker's lease on a job (arq's in-progress key)."""
    return IN_PROGRESS_KEY_PREFIX + exec_id


def retry_key(exec_id: str) -> str:
    return RETRY_KEY_PREFIX + exec_id


def encode_job(payload: bytes, enqueue_ms: int) -> bytes:
    """The job as ``ArqRedis.enqueue_job`` would store it (job id = execution id), in msgpack."""
    return _encoder.encode({"t": 1, "f": FUNCTION, "a": [payload], "k": {}, "et": enqueue_ms})
