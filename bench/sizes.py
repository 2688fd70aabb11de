"""The sizes each cost curve is measured at (bench/curves.py), in the full run and in --quick, and
the requests the HTTP curves send."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from bench import latency, wrk

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class Sizes:
    payload_bytes: tuple[int, ...]  # the echo tool's argument, and so its result
    progress_events: tuple[int, ...]  # ctx.progress calls per execution
    catalog_tools: tuple[int, ...]  # tools one worker serves
    idle_streams: tuple[int, ...]  # SSE streams held open on one API process
    waiting: tuple[int, ...]  # executions waiting in one queue (no worker takes them)
    queued_jobs: tuple[int, ...]  # jobs due an hour ahead
    calls: int  # SSE calls per point; single SUBMITs, LEASEs and CREATEs timed per point


FULL = Sizes(payload_bytes=(KIB, 64 * KIB, MIB), progress_events=(0, 100, 1000), catalog_tools=(10, 1000, 10_000),
             idle_streams=(1000, 10_000), waiting=(1000, 10_000, 100_000), queued_jobs=(10_000, 100_000, 1_000_000),
             calls=100)
# CI's smoke run: the two smallest sizes of each, about a minute in all.
QUICK = Sizes(payload_bytes=(KIB, 64 * KIB), progress_events=(0, 100), catalog_tools=(10, 1000),
              idle_streams=(100, 1000), waiting=(1000, 10_000), queued_jobs=(10_000,), calls=20)

JSON = (("content-type", "application/json"),)
COMPLETED = '"status":"completed"'


def call(tool: str, arguments: dict[str, object]) -> wrk.Request:
    """``POST /agent/execute`` of ``tool`` with ``arguments``, answered ``completed``."""
    return wrk.Request("/agent/execute", method="POST", body=json.dumps({"tool": tool, "arguments": arguments}),
                       headers=JSON, expect_text=COMPLETED)


# The body of an echo call around its string: ``{"tool": "echo", "arguments": {"data": ""}}``.
ECHO_ENVELOPE = len(json.dumps({"tool": "echo", "arguments": {"data": ""}}))


def echo_arguments(size: int) -> dict[str, object]:
    """The echo tool's arguments, whose body is ``size`` bytes in all (its one string ASCII): the
    largest, 1 MiB, is then the API's limit on a body."""
    return {"data": "x" * (size - ECHO_ENVELOPE)}


def sse_times(base: str, tool: str, arguments: dict[str, object], calls: int) -> latency.Percentiles:
    """ms from each streamed call's request to the end of its stream, ``calls`` one after another
    on one connection (after five not counted)."""
    url = urlsplit(base)
    request = latency.sse_request(url.netloc, {"tool": tool, "arguments": arguments})
    totals = []
    with socket.create_connection((url.hostname or "127.0.0.1", url.port or 80), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(5 + calls):
            _, total = latency.sse_call(sock, request)
            if i >= 5:
                totals.append(total)
    return latency.percentiles(totals)
