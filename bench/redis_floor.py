"""The floor under any Redis-queued call: one raw round trip through Redis between two processes.

Process A (the caller) LPUSHes a message and waits on a pub/sub channel; process B (the
"worker", ``python -m bench.redis_floor serve URL``) BLPOPs it and PUBLISHes it back. That is
the least a queue-based dispatch has to do, with nothing on top: no HTTP, no records, no JSON.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import redis

from bench.processes import ROOT

REQUESTS = "bench:floor:requests"
REPLIES = "bench:floor:replies"
STOP = b"stop"


@dataclass(frozen=True)
class FloorResult:
    round_trips: int
    p50_us: float
    p99_us: float
    mean_us: float


def serve(url: str) -> None:
    """Process B: pop each message and publish it back, until told to stop."""
    client = redis.Redis.from_url(url)
    while True:
        _, message = client.blpop([REQUESTS], timeout=0)  # type: ignore[misc]  # sync client
        if message == STOP:
            return
        client.publish(REPLIES, message)


def measure(url: str, round_trips: int, warmup: int = 100) -> FloorResult:
    """Process A: time ``round_trips`` push → pop → publish → receive cycles, one at a time."""
    client = redis.Redis.from_url(url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(REPLIES)  # before B starts, so no reply can be missed
    server = subprocess.Popen([sys.executable, "-m", "bench.redis_floor", "serve", url], cwd=ROOT)
    try:
        samples = [_round_trip(client, pubsub, i) for i in range(warmup + round_trips)][warmup:]
    finally:
        client.lpush(REQUESTS, STOP)
        server.wait(10)
        pubsub.close()
        client.close()
    samples.sort()
    return FloorResult(round_trips=len(samples), p50_us=samples[len(samples) // 2],
                       p99_us=samples[int(len(samples) * 0.99)], mean_us=statistics.fmean(samples))


def _round_trip(client: redis.Redis, pubsub: redis.client.PubSub, i: int) -> float:
    token = str(i).encode()
    start = time.perf_counter_ns()
    client.lpush(REQUESTS, token)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        # None also stands for a skipped subscribe confirmation: keep waiting.
        message = pubsub.get_message(timeout=1)
        if message is not None and message["data"] == token:
            return (time.perf_counter_ns() - start) / 1000
    raise TimeoutError("no reply from the redis_floor server process within 10 s")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit("usage: python -m bench.redis_floor serve REDIS_URL")
