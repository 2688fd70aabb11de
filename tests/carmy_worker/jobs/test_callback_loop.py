"""The callback loop against a real Redis and real receivers on 127.0.0.1: a receiver that never
answers holds only its own share of the loop (PER_RECEIVER deliveries, until the timeout), not
everyone's callbacks; a busy receiver that answers gets all of its own, PER_RECEIVER at a time,
none put off.

Before, the loop delivered a batch and waited for all of it: a batch holding callbacks to a
receiver that hangs held every other receiver's for the 10 s timeout, batch after batch."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import redis.asyncio

from carmy_worker.jobs import callbacks, outbound
from carmy_worker.jobs.callbacks import AT_ONCE, PER_RECEIVER, CallbackLoop
from carmy_worker.settings import NotifySettings
from carmy_worker.store import keys
from tests.callbacks import receiver
from tests.carmy_worker.jobs.test_callbacks import SECRET, pending
from tests.cells import cells  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("cells")
SETTINGS = NotifySettings(secret=SECRET, hosts=("127.0.0.1",), allow_private=True)
PATIENCE_S = 60.0  # a bound for a busy machine; the conditions below are what is waited for


@dataclass
class Hang:
    """A receiver that reads each request and never answers: how many came, and how many of
    their connections have since been closed (by the caller giving up)."""

    port: int = 0
    came: int = 0
    closed: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)


@contextlib.asynccontextmanager
async def hanging() -> AsyncIterator[Hang]:
    hang = Hang()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hang.came += 1
        hang.writers.append(writer)
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        hang.closed += 1

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    hang.port = server.sockets[0].getsockname()[1]
    try:
        yield hang
    finally:
        for writer in hang.writers:
            writer.close()
        server.close()


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not await condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def due_to(ar: redis.asyncio.Redis, url: str) -> str:
    job_id = keys.new_job_id(keys.partition_count() - 1)
    await pending(ar, job_id)
    await ar.hset(keys.job(job_id), "notify_url", url)
    return job_id


@contextlib.asynccontextmanager
async def running(loop: CallbackLoop) -> AsyncIterator[None]:
    task = asyncio.create_task(loop.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.slow
async def test_a_receiver_that_hangs_holds_no_one_elses_callbacks(ar: redis.asyncio.Redis,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The hanging deliveries give up after PATIENCE_S rather than 10 s, so that "before any of
    # them gave up" below holds on a machine however busy.
    monkeypatch.setattr(outbound, "post", functools.partial(outbound.post, timeout=PATIENCE_S))
    async with hanging() as hang:
        stuck = [await due_to(ar, f"http://127.0.0.1:{hang.port}/hooks") for _ in range(2 * AT_ONCE)]
        with receiver() as other:
            later = await due_to(ar, other.url("/jobs"))  # due after every one of the hanging receiver's
            async with running(CallbackLoop(ar, SETTINGS)):
                await until(lambda: _state(ar, later, "delivered"), "the other receiver's callback")
                # Delivered while the hanging receiver holds its share, before any gave up.
                assert len(other.to("/jobs")) == 1
                assert (hang.came, hang.closed) == (PER_RECEIVER, 0)
                # Its others were put back, not tried: no attempt counted, none given up.
                tries = {int(await ar.hget(keys.job(j), "notify_tries") or 0) for j in stuck}
                assert tries == {0}
                assert {await ar.hget(keys.job(j), "notify_state") for j in stuck} == {b"pending"}


async def _state(ar: redis.asyncio.Redis, job_id: str, state: str) -> bool:
    return await ar.hget(keys.job(job_id), "notify_state") == state.encode()


@pytest.mark.slow
async def test_a_busy_receiver_gets_all_its_callbacks_in_turn_none_put_off(ar: redis.asyncio.Redis,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Busy, not slow: a receiver that answers each delivery is put off only once its oldest
    # under way is SLOW_S old, which a busy machine's test receiver reached (one put off).
    monkeypatch.setattr(callbacks, "SLOW_S", PATIENCE_S)
    count = 3 * AT_ONCE
    with receiver() as busy:
        job_ids = [await due_to(ar, busy.url("/jobs")) for _ in range(count)]
        loop = CallbackLoop(ar, SETTINGS)
        put_off = 0
        put_back = loop._callbacks.later

        async def counted(job_id: str, message_id: str, delay_ms: int) -> str:
            nonlocal put_off
            put_off += 1
            return await put_back(job_id, message_id, delay_ms)

        loop._callbacks.later = counted  # type: ignore[method-assign]
        async with running(loop):
            for job_id in job_ids:
                await until(lambda j=job_id: _state(ar, j, "delivered"), f"{job_id} delivered")
        assert len(busy.to("/jobs")) == count
        assert put_off == 0
        tries = {int(await ar.hget(keys.job(j), "notify_tries") or 0) for j in job_ids}
        assert tries == {1}
