"""Streams without a request id: a share of the clients' turns (``--streams``) is one SSE call of
``named`` (``chaos.tools``) with no ``request_id``, made once (without one, a retry would be a new
call). Such a call's ``execution.started`` goes out as soon as its SUBMIT has left for Redis, before
Redis has answered (docs/protocol.md, section 5), so the id it names must hold whatever happens
next: a refusal, a Redis that stops answering, an API killed mid-stream. The stream is set against
the records Redis holds at the end (``Trail.records``), read once every call has finished.

Definitions (each a violation):

* **misnamed**: ``execution.completed`` names another execution than ``execution.started`` did.
* **answered, no record**: the stream ended with its tool's answer (completed or failed, not a
  refusal) and no record of that execution is there at the end.
* **unlike its record**: that answer's status or error code is not its record's.
* **refused, yet recorded**: the stream ended with a refusal SUBMIT gives (``QUEUE_FULL``,
  ``RATE_LIMITED``, ``NO_WORKERS``, ``STORE_FULL``: nothing created) and the execution it named
  has a record at the end.
* **stale progress**: the stream carried a ``tool.progress`` event of an attempt after one of a
  later attempt (``named`` reports its attempt in each; its thread goes on after its worker
  wakes from a pause, and only the attempt that holds the execution may publish).

Counted as info: streams ended ``STORE_UNAVAILABLE`` (the SUBMIT may have reached Redis and run
after all: of them, those with a record), and streams cut off before ``execution.completed`` (an
API killed, a timeout).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Iterable

import httpx
from msgspec import Struct

from chaos.calls import answer_of, code_of
from chaos.model import RecordSeen, Stream, marked

SHARE = 0.05  # of the clients' turns, by default
TOOL = "named"
WORK_MS = (0, 300)
TIMEOUT = httpx.Timeout(30.0, connect=2.0)
# Refusals SUBMIT answers with, having created nothing (store/submit.py).
SUBMIT_REFUSALS = frozenset({"QUEUE_FULL", "RATE_LIMITED", "NO_WORKERS", "STORE_FULL"})


class StreamLoad:
    """The streams the clients make, kept for the check."""

    def __init__(self, share: float = SHARE) -> None:
        self.share = share
        self.streams: list[Stream] = []

    def call(self, client: httpx.Client, rng: random.Random, base: str) -> None:
        """One streamed call without a request id, read to its end (or until it is cut off)."""
        stream = Stream(t0=time.time(), t1=0.0, api=base)
        self.streams.append(stream)  # list.append is atomic under the GIL
        envelope = {"tool": TOOL, "arguments": marked({"ms": rng.randint(*WORK_MS)})}
        try:
            with client.stream("POST", base + "/agent/execute", json=envelope,
                               headers={"accept": "text/event-stream"}, timeout=TIMEOUT) as r:
                stream.http = r.status_code
                if r.headers.get("content-type", "").startswith("text/event-stream"):
                    read(r.iter_lines(), stream)
        except (httpx.HTTPError, ValueError) as exc:  # ValueError: a frame cut short is not JSON
            stream.error = f"{type(exc).__name__}: {exc}"[:200]
        stream.t1 = time.time()


def read(lines: Iterable[str], stream: Stream) -> None:
    """Takes the named id and the final answer from the stream's lines."""
    event = ""
    for line in lines:
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and event == "execution.started":
            stream.started = json.loads(line[6:])["execution_id"]
        elif line.startswith("data: ") and event == "tool.progress":
            attempt = int(json.loads(line[6:])["message"])
            stream.stale += attempt < stream.attempt
            stream.attempt = max(stream.attempt, attempt)
        elif line.startswith("data: ") and event == "execution.completed":
            body = json.loads(line[6:])
            stream.completed = body.get("execution_id")
            stream.code = code_of(body)
            stream.status = body.get("status")
            stream.answered = answer_of(body) is not None
            return


class StreamTable(Struct, kw_only=True):
    """The streams' findings. Lists hold execution ids (the one each stream named first)."""

    streams: int
    ended: int  # with execution.completed
    answered: int  # of them, with the tool's answer
    refused: dict[str, int]  # the others, by code
    unavailable_recorded: int  # of those ended STORE_UNAVAILABLE, those whose execution has a record
    retried: int  # streams that carried progress of a second attempt or later
    misnamed: list[str]
    answered_unrecorded: list[str]
    unlike: list[str]
    refused_recorded: list[str]
    stale_progress: list[str]

    def violations(self) -> dict[str, int]:
        found = {"streams misnamed": len(self.misnamed),
                 "streamed answers without a record": len(self.answered_unrecorded),
                 "streamed answers unlike their records": len(self.unlike),
                 "streams refused by SUBMIT, yet recorded": len(self.refused_recorded),
                 "streams with an attempt's progress after a later attempt's": len(self.stale_progress)}
        return {name: n for name, n in found.items() if n}

    def named(self) -> set[str]:
        return {xid for xids in (self.misnamed, self.answered_unrecorded, self.unlike, self.refused_recorded,
                                 self.stale_progress)
                for xid in xids}


def reconcile_streams(streams: list[Stream], records: list[RecordSeen]) -> StreamTable:
    """The rows, from what each stream said and the records read at the end."""
    by_id = {record.xid: record for record in records}
    ended = [s for s in streams if s.completed is not None and s.started is not None]
    refused = Counter(s.code or "-" for s in ended if not s.answered)
    answered = [s for s in ended if s.answered]
    return StreamTable(
        streams=len(streams), ended=len(ended), answered=len(answered), refused=dict(sorted(refused.items())),
        unavailable_recorded=sum(s.code == "STORE_UNAVAILABLE" and s.started in by_id for s in ended),
        retried=sum(s.attempt > 1 for s in streams),
        misnamed=sorted(str(s.started) for s in ended if s.completed != s.started),
        answered_unrecorded=sorted(str(s.started) for s in answered if s.started not in by_id),
        unlike=sorted(str(s.started) for s in answered if s.started in by_id
                      and (by_id[str(s.started)].status, by_id[str(s.started)].error_code) != (s.status, s.code)),
        refused_recorded=sorted(str(s.started) for s in ended
                                if s.code in SUBMIT_REFUSALS and s.started in by_id),
        stale_progress=sorted(str(s.started) for s in streams if s.stale),  # cut off or not
    )
