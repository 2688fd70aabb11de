"""The shape's floor (bench/shape_floor.py) does what its row says: each call's token goes
through a worker process and back through Redis before the call is answered."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from bench import shape_floor
from bench.processes import ROOT, RedisServer


def test_a_command_is_written_in_redis_protocol() -> None:
    assert shape_floor.command(b"LPUSH", b"q", b"7") == b"*3\r\n$5\r\nLPUSH\r\n$1\r\nq\r\n$1\r\n7\r\n"


async def test_each_call_is_answered_only_once_the_worker_has_sent_its_token_back(
        redis_server: RedisServer) -> None:
    url = redis_server.url
    shape = shape_floor._Shape()
    await shape.connect(url)
    try:
        with pytest.raises(TimeoutError):  # no worker yet: the call waits for its token
            async with asyncio.timeout(0.2):
                await shape.call()
        worker = subprocess.Popen([sys.executable, "-m", "bench.shape_floor", "serve", url], cwd=ROOT,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == shape_floor.READY
            for _ in range(3):  # the first pops the token left by the call that timed out
                await shape.call()
            assert shape.waiting == {}
        finally:
            shape_floor.stop(url)
            assert worker.wait(10) == 0
            if worker.stdout is not None:
                worker.stdout.close()
    finally:
        shape.close()
