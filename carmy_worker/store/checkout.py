"""A connection's check on its way out of the pool, without reading from it.

Before handing out a connection, redis-py's asyncio pools make sure it holds no unread data by
reading from it with a zero timeout (``can_read_destructive``): with nothing to read, the caller
is suspended for a turn of the event loop, a timer fires and a ``TimeoutError`` is raised and
caught, before every command. That was 5 % of a worker's CPU, and a turn of the loop added to
each command's latency.

Data is left unread only by a command cut off mid-reply, and redis-py closes the connection when
that happens. Anything the server did send sits in the connection's buffers already (the event
loop reads a connection's socket as soon as it is readable), and so does a close by the server,
or a reset (uvloop then closes the transport and keeps the error for the next read).
``QuickCheckout`` looks there instead: a connection with something buffered, closed or reset is
connected again, as redis-py's own check would have it.
"""

from __future__ import annotations

from typing import Any

from redis._parsers.hiredis import NOT_ENOUGH_DATA
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError


class QuickCheckout:
    """Mixed in before a redis-py asyncio pool class."""

    async def ensure_connection(self, connection: AbstractConnection) -> None:
        await connection.connect()
        if is_stale(connection):
            await connection.disconnect()
            await connection.connect()


def is_broken(connection: AbstractConnection) -> bool:
    """Whether ``connection`` was closed or reset under it: nothing written on it now would be
    answered (replies already buffered may still be read)."""
    stream: Any = getattr(connection, "_reader", None)  # the asyncio.StreamReader
    if stream is None:
        return False
    if stream.at_eof() or stream.exception() is not None:
        return True
    writer: Any = getattr(connection, "_writer", None)
    return writer is not None and writer.transport.is_closing()


def is_stale(connection: AbstractConnection) -> bool:
    """Whether an idle ``connection`` holds a reply nobody read, or is broken (a connection not
    yet connected is neither). Reads what is buffered: not for a connection with replies due."""
    stream: Any = getattr(connection, "_reader", None)
    if stream is None:
        return False
    if is_broken(connection) or stream._buffer:
        return True
    parser: Any = getattr(connection, "_parser", None)
    if getattr(parser, "_buffer", None):  # redis-py's own parser
        return True
    reader = getattr(parser, "_reader", None)  # hiredis's
    return reader is not None and reader.gets() is not NOT_ENOUGH_DATA


def buffered_reply(connection: AbstractConnection) -> Any:
    """The next reply, if hiredis already holds all of it (``NOT_ENOUGH_DATA`` otherwise): what
    ``read_response`` would return, an error reply as its ``ResponseError`` (returned, not
    raised), without the coroutine, the read timeout and the checks around it. A connection
    error the server sent is raised. A connection with redis-py's own parser holds none."""
    reader = getattr(getattr(connection, "_parser", None), "_reader", None)
    if reader is None:
        return NOT_ENOUGH_DATA
    reply = reader.gets()
    if isinstance(reply, ConnectionError):
        raise reply
    if isinstance(reply, list) and reply and isinstance(reply[0], ConnectionError):
        raise reply[0]
    return reply
