"""``race_disconnect`` on its own: the cancel of a caller's execution is issued as soon as the
caller is gone, whatever the work answering it is doing."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from starlette.types import Message

from api.endpoints.relay import race_disconnect
from carmy_worker.sdk.errors import error
from carmy_worker.store import records
from carmy_worker.wire import Record

RECORD = records.failed("exec_1", "t", error("CANCELLED", "gone"))


class Client:
    """The ASGI ``receive`` of a request whose body was read: it ends when the client goes."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self) -> Message:
        await self.gone.wait()
        return {"type": "http.disconnect"}


async def test_the_cancel_does_not_wait_for_the_work_to_stop() -> None:
    client, cancelled, release = Client(), asyncio.Event(), asyncio.Event()

    async def stubborn() -> Record:
        # Swallows its cancellation, as asyncio.wait_for can on 3.11, and takes its time.
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()
        return RECORD

    async def cancel() -> None:
        cancelled.set()

    race = asyncio.create_task(race_disconnect(stubborn(), client.receive, cancel))
    await asyncio.sleep(0)
    client.gone.set()
    await asyncio.wait_for(cancelled.wait(), 5)  # while the work still runs
    assert not race.done()
    release.set()
    assert await race is None  # the caller left: nobody was answered


async def test_a_complete_answer_is_not_a_departure() -> None:
    # Once a response is complete, uvicorn's receive() says http.disconnect at once.
    client, cancels = Client(), []

    async def answer() -> Record:
        client.gone.set()
        return RECORD

    async def cancel() -> None:
        cancels.append(1)

    assert await race_disconnect(answer(), client.receive, cancel) is RECORD
    assert cancels == []


async def test_an_error_of_the_work_is_raised_as_itself() -> None:
    async def fail() -> Record:
        raise RedisConnectionError("down")

    with pytest.raises(RedisConnectionError):
        await race_disconnect(fail(), Client().receive, None)


async def test_the_cancel_completes_when_the_request_is_cancelled_meanwhile() -> None:
    # A server shutting down cancels the request's task: the execution is cancelled all the same.
    client, started, release, done = Client(), asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def forever() -> Record:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def cancel() -> None:
        started.set()
        await release.wait()
        done.set()

    race = asyncio.create_task(race_disconnect(forever(), client.receive, cancel))
    await asyncio.sleep(0)
    client.gone.set()
    await asyncio.wait_for(started.wait(), 5)
    race.cancel()
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await race
    await asyncio.wait_for(done.wait(), 5)
