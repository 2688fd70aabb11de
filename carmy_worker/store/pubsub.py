"""A pub/sub subscription that outlives its connection: the one reconnect loop of the project
(the API's event hub, the workers' cancel channels) on one Redis. Plain channels (``SUBSCRIBE``)
and sharded ones (``SSUBSCRIBE``, Redis 7: the per-partition channels the scripts ``SPUBLISH``
to) share its one connection; a cluster's sharded channels are ``store.shardpubsub``'s."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from typing import Any

from redis._parsers.hiredis import NOT_ENOUGH_DATA
from redis.asyncio import Redis

from carmy_worker.store.checkout import buffered_reply

log = logging.getLogger("carmy.pubsub")

Message = dict[str, Any]


# A sharded subscription's replies, named as the plain ones are, so that one handler serves both.
SHARDED_KINDS = {b"smessage": "message", b"ssubscribe": "subscribe", b"sunsubscribe": "unsubscribe"}


def _message(reply: list[Any]) -> Message:
    """A reply on a subscribed connection as redis-py's ``PubSub.get_message`` gives it: a
    ``message`` (channel, data) or a confirmation of ``subscribe``/``unsubscribe`` (channel,
    count), sharded or not. No patterns are subscribed: a ``pmessage`` never comes."""
    kind = reply[0]
    named = SHARDED_KINDS.get(kind) or (kind.decode() if isinstance(kind, bytes) else kind)
    return {"type": named, "pattern": None, "channel": reply[1], "data": reply[2]}


def stop_if_cancelled() -> None:
    """Raise the cancellation a call swallowed although it returned: on Python 3.11, a cancel
    that comes as the call completes (``asyncio.wait_for``'s race, which redis-py's timeouts
    and our pool's waits go through) is lost, and a loop that sleeps and goes on would never
    stop. ``Task.cancelling()`` still knows; every run-forever loop asks after each pass."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def raise_if_cancelled(exc: BaseException) -> None:
    """Re-raise a cancellation a library turned into another error.

    redis-py can swallow the ``CancelledError`` of a call it was in and raise a connection
    error instead; a loop that retries on errors would then never stop (a lifespan or a
    shutdown waiting on it forever). ``Task.cancelling()`` still knows.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc


async def listen_forever(
    redis: Redis,
    channels: Callable[[], Collection[str]],
    on_message: Callable[[Message], None],
    *,
    name: str,
    on_connect: Callable[[bool], None] | None = None,
    on_drop: Callable[[Collection[str]], None] | None = None,
    max_backoff: float = 1.0,
    sharded: Callable[[], Collection[str]] = tuple,
) -> None:
    """Subscribe to ``channels()`` and ``sharded()`` (``SSUBSCRIBE``) and hand every message
    (subscribe confirmations included, sharded ones named as plain ones) to ``on_message``,
    until cancelled.

    When the connection drops, it reconnects with a backoff (0.1 s doubling up to
    ``max_backoff``) and subscribes again to what ``channels()`` says then. ``on_connect(after_drop)``
    runs once subscribed (``after_drop``: this is a reconnection); ``on_drop(channels)``
    runs whenever a connection ends, naming every channel, since messages published meanwhile
    are lost.
    """
    delay, lost = 0.1, False
    while True:
        pubsub = redis.pubsub()
        plain, shards = list(channels()), list(sharded())
        try:
            if plain:
                await pubsub.subscribe(*plain)
            for channel in shards:  # one a command: each may be in a slot of its own
                await pubsub.execute_command("SSUBSCRIBE", channel)
            if lost:
                log.info("%s: connection restored", name)
            if on_connect is not None:
                on_connect(lost)
            delay, lost = 0.1, False
            connection = pubsub.connection
            assert connection is not None  # subscribed
            while True:
                # Read off the connection itself: redis-py's get_message wraps each read in its
                # retry and health-check machinery, a tenth of the API's CPU per execution under
                # load, for a connection this loop already re-opens itself when it drops. Messages
                # that came together are taken from the parser's buffer as they are.
                reply = buffered_reply(connection)
                if reply is NOT_ENOUGH_DATA:
                    reply = await connection.read_response()
                on_message(_message(reply))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the connection dropped (or Redis is not there yet)
            raise_if_cancelled(exc)
            if not lost:
                log.warning("%s: connection lost (%s); resubscribing", name, exc)
            lost = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_backoff)
        finally:
            if on_drop is not None:
                on_drop([*plain, *shards])
            with contextlib.suppress(Exception):
                await pubsub.aclose()
