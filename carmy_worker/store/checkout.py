"""A connection's check on its way out of the pool, without reading from it.

Before handing out a connection, redis-py's asyncio pools make sure it holds no unread data by
reading from it with a zero timeout (``can_read_destructive``): with nothing to read, the caller
is suspended for a turn of the event loop, a timer fires and a ``TimeoutError`` is raised and
caught, before every command. That was 5 % of a worker's CPU, and a turn of the loop added to
each command's latency.

Data is left unread only by a command cut off mid-reply, and redis-py closes the connection when
that happens. Anything the server did send sits in the connection's buffers already (the event
loop reads a connection's socket as soon as it is readable), and so does a close by the server.
``QuickCheckout`` looks there instead: a connection with something buffered, or closed, is
connected again, as redis-py's own check would have it.
"""

from __future__ import annotations

from typing import Any

from redis._parsers.hiredis import NOT_ENOUGH_DATA
from redis.asyncio.connection import AbstractConnection


class QuickCheckout:
    """Mixed in before a redis-py asyncio pool class."""

    async def ensure_connection(self, connection: AbstractConnection) -> None:
        await connection.connect()
        if has_unread(connection):
            await connection.disconnect()
            await connection.connect()


def has_unread(connection: AbstractConnection) -> bool:
    """Whether ``connection`` holds a reply nobody read, or was closed by the server (a
    connection not yet connected has neither)."""
    stream: Any = getattr(connection, "_reader", None)  # the asyncio.StreamReader
    if stream is None:
        return False
    if stream.at_eof() or stream._buffer:
        return True
    parser: Any = getattr(connection, "_parser", None)
    if getattr(parser, "_buffer", None):  # redis-py's own parser
        return True
    reader = getattr(parser, "_reader", None)  # hiredis's
    return reader is not None and reader.gets() is not NOT_ENOUGH_DATA
