"""What becomes of a job once an attempt has its record: finished, or tried again after a
backoff. Pure: the job loop (``jobs.driver``) reads the record and the job, asks ``decide``, and
CONCLUDE applies the answer only if the attempt is still the job's current one.

The rules (docs/protocol.md, "Jobs"):

* completed: ``succeeded``;
* cancelled (its caller cancelled the job or its execution): ``cancelled``;
* an uncertain outcome (``EXECUTION_UNCERTAIN``, ``TOOL_PANIC``, a ``TIMEOUT`` after the tool
  began): tried again only if the tool is idempotent; any other job is ``dead_lettered`` with
  ``EXECUTION_UNCERTAIN`` (its cause in ``details``) and never runs again by itself;
* an attempt that never began (it waited past its start window): tried again;
* an error that says it is retryable: tried again;
* anything else: ``failed``.

Tried again means due again after ``backoff``; a job out of attempts is ``dead_lettered``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import msgspec
from msgspec import Struct

from carmy_worker.sdk.errors import error
from carmy_worker.store.jobstore import JobState
from carmy_worker.wire import ErrorBody, Record, json_encoder

# Codes that say an attempt may or may not have had its effects.
UNCERTAIN = frozenset({"EXECUTION_UNCERTAIN", "TOOL_PANIC"})
JITTER = 0.1  # a backoff is lengthened by up to this share of itself, at random


class _Failure(Struct):
    error: ErrorBody | None = None


_failure_decoder = msgspec.json.Decoder(_Failure)


@dataclass(frozen=True)
class Decision:
    """``status``: where the job goes (``queued`` again after ``delay_ms``, or a finished
    status); ``last_error`` and ``result`` (JSON) are what its view shows from now on."""

    status: str
    delay_ms: int = 0
    last_error: bytes = b""
    result: bytes = b""


def backoff_ms(n: int, *, base_ms: int, cap_ms: int, retry_after_s: int | None = None,
               rng: random.Random | None = None) -> int:
    """The wait before the retry that follows the ``n``-th attempt (1-based):
    ``max(base · 2^(n-1) capped at cap, retry_after)``, plus up to ``JITTER`` of it at random."""
    delay: int = min(base_ms * 2 ** min(max(n - 1, 0), 40), cap_ms)
    if retry_after_s is not None:
        delay = max(delay, retry_after_s * 1000)
    return delay + round(delay * JITTER * (rng or random).random())


def decide(record: Record, job: JobState, *, began: bool, rng: random.Random | None = None) -> Decision:
    """The job's next step after ``record``, its current attempt's. ``began``: a worker claimed
    the attempt to run its tool (the execution has a ``started_at``)."""
    if record.status == "completed":
        return Decision("succeeded", result=record.body)
    try:
        err = _failure_decoder.decode(record.body).error
    except msgspec.DecodeError:
        err = None
    if err is None:  # a record of before error bodies: treat it as what it may be
        err = error("EXECUTION_UNCERTAIN", "The attempt ended without a readable error.")
    last_error = json_encoder.encode(err)
    if record.status == "cancelled" or job.cancel:
        return Decision("cancelled", last_error=last_error, result=record.body)
    uncertain = err.code in UNCERTAIN or (err.code == "TIMEOUT" and began)
    if uncertain and not job.idempotent:
        dead = error(
            "EXECUTION_UNCERTAIN",
            f"Attempt {job.attempts} of this job ended with {err.code}: its effects may or may not have "
            f"happened, and {job.tool} is not idempotent, so the job is not run again by itself. Check the "
            "state it would have changed, then retry it as an operator if it should run.",
            suggested_action="reconcile",
            details={"cause": err.code, "message": err.message, "execution_id": job.execution_id},
        )
        return Decision("dead_lettered", last_error=json_encoder.encode(dead), result=record.body)
    if not (uncertain or not began or err.retryable):
        return Decision("failed", last_error=last_error, result=record.body)
    if job.attempts_left <= 0:
        return Decision("dead_lettered", last_error=last_error, result=record.body)
    delay = backoff_ms(job.attempts - job.base_attempts, base_ms=job.backoff_ms, cap_ms=job.max_backoff_ms,
                       retry_after_s=err.retry_after, rng=rng)
    return Decision("queued", delay_ms=delay, last_error=last_error)
