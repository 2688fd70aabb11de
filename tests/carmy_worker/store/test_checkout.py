"""A connection's check on its way out of the pool: without reading from the socket, a
connection left with an unread reply, or closed by the server, is connected again."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis
from redis._parsers.hiredis import NOT_ENOUGH_DATA
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ResponseError

from carmy_worker.store.checkout import buffered_reply
from carmy_worker.store.connect import RedisConnector
from tests.support import RedisServer, wait_until_async


@pytest.fixture(params=["plain", "store"])
async def pool(request: pytest.FixtureRequest, redis_server: RedisServer,
               monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[object]:
    async def never(self: AbstractConnection) -> bool:
        raise AssertionError("the checkout read from the socket")

    # The check must not read: redis-py's own would call this before every command.
    monkeypatch.setattr(AbstractConnection, "can_read_destructive", never)
    connector = RedisConnector(redis_server.url)
    client = connector.client() if request.param == "plain" else connector.store_client(max_connections=2, wait=1)
    yield client.connection_pool
    await client.aclose()


async def test_a_connection_left_with_an_unread_reply_is_connected_again(pool: object) -> None:
    conn = await pool.get_connection()  # type: ignore[attr-defined]
    await conn.send_command("ECHO", "stale")
    await wait_until_async(lambda: len(conn._reader._buffer) > 0, what="the reply to arrive unread")
    await pool.release(conn)  # type: ignore[attr-defined]
    again = await pool.get_connection()  # type: ignore[attr-defined]
    await again.send_command("ECHO", "fresh")
    assert await again.read_response() == b"fresh"  # not the stale reply
    await pool.release(again)  # type: ignore[attr-defined]


async def test_a_connection_the_server_closed_is_connected_again(pool: object, redis_server: RedisServer) -> None:
    conn = await pool.get_connection()  # type: ignore[attr-defined]
    await conn.send_command("CLIENT", "SETNAME", "checkout-test")
    assert await conn.read_response() == b"OK"
    await pool.release(conn)  # type: ignore[attr-defined]
    admin = redis.Redis.from_url(redis_server.url)
    admin.execute_command("CLIENT", "KILL", "SKIPME", "yes", "TYPE", "normal")
    admin.close()
    await wait_until_async(lambda: conn._reader is None or conn._reader.at_eof(), what="the close to reach the client")
    again = await pool.get_connection()  # type: ignore[attr-defined]
    await again.send_command("PING")
    assert await again.read_response() in (b"PONG", "PONG", True)
    await pool.release(again)  # type: ignore[attr-defined]



async def test_a_buffered_reply_is_taken_as_read_response_would_give_it(redis_server: RedisServer) -> None:
    client = RedisConnector(redis_server.url).client()
    conn = await client.connection_pool.get_connection()
    assert buffered_reply(conn) is NOT_ENOUGH_DATA  # nothing asked
    await conn.send_packed_command(conn.pack_commands([("SET", "k", "v"), ("GET", "k"), ("INCR", "k"), ("PING",)]))
    # All four replies in the connection's buffer: the first read takes them all.
    await wait_until_async(lambda: bytes(conn._reader._buffer).endswith(b"+PONG\r\n"), what="the four replies")
    assert await conn.read_response() == b"OK"
    assert buffered_reply(conn) == b"v"
    error = buffered_reply(conn)
    assert isinstance(error, ResponseError) and "not an integer" in str(error)  # returned, not raised
    assert buffered_reply(conn) == b"PONG"
    assert buffered_reply(conn) is NOT_ENOUGH_DATA
    await client.connection_pool.release(conn)
    await client.aclose()
