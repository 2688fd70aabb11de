"""Background loops stop when cancelled, even when redis-py turns the cancellation into a
connection error (seen as a lifespan that never ended under load)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError

from carmy_worker.store.janitor import Janitor
from carmy_worker.store.pubsub import listen_forever


class Swallowing:
    """A Redis call that never answers and, cancelled, raises a connection error instead;
    ``entered`` once a loop is in it."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()

    async def __call__(self) -> None:
        self.entered.set()
        try:
            await asyncio.get_running_loop().create_future()  # a reply that never comes
        except asyncio.CancelledError:
            raise RedisConnectionError("Connection closed by server.") from None


async def stops_when_cancelled(loop: asyncio.Task[None], call: Swallowing) -> None:
    await asyncio.wait_for(call.entered.wait(), 10)
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(loop, 2)


async def test_the_janitor_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    janitor = Janitor(redis.asyncio.Redis.from_url("redis://127.0.0.1:1/0"), retention=60, dead_after=3)
    swallowed = Swallowing()

    async def sweep() -> int:
        await swallowed()
        return 0

    monkeypatch.setattr(janitor, "sweep", sweep)
    await stops_when_cancelled(asyncio.create_task(janitor.run(interval=0.01)), swallowed)


async def test_a_resubscribing_loop_stops() -> None:
    swallowed = Swallowing()

    class Client:
        def pubsub(self) -> object:
            class PubSub:
                async def subscribe(self, *channels: str) -> None:
                    await swallowed()

                async def aclose(self) -> None:
                    pass

            return PubSub()

    task = asyncio.create_task(listen_forever(Client(), lambda: ["c"], lambda m: None, name="test"))  # type: ignore[arg-type]
    await stops_when_cancelled(task, swallowed)


class Returning(Swallowing):
    """A Redis call that, cancelled, returns as if it had its reply: Python 3.11's
    ``asyncio.wait_for`` does so when the cancel comes as the reply does."""

    async def __call__(self) -> None:
        self.entered.set()
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            return


async def test_the_janitor_stops_when_a_call_swallowed_its_cancel_and_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    janitor = Janitor(redis.asyncio.Redis.from_url("redis://127.0.0.1:1/0"), retention=60, dead_after=3)
    swallowed = Returning()

    async def sweep() -> int:
        await swallowed()
        return 0

    monkeypatch.setattr(janitor, "sweep", sweep)
    await stops_when_cancelled(asyncio.create_task(janitor.run(interval=0.01)), swallowed)
