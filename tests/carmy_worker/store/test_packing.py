"""Commands packed by hiredis: the same bytes as redis-py's packer, the same errors, on every
client the connector builds, against the real server."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.packing import HiredisPacking, packed_by_hiredis
from tests.support import RedisServer

FAST = type("FastConnection", (HiredisPacking, Connection), {})()
PLAIN = Connection()


@pytest.mark.parametrize("args", [
    ("GET", "carmy:exe:ab12"),
    ("EVALSHA", "a" * 40, 2, "k1", b"k2", 0.5, -1.0, 12345678901234567890, "héllo ☃", b"\x00\xff", ""),
    ("SCRIPT LOAD", "return 1"),
    (b"CLIENT SETNAME", b"worker"),
    ("SET", "k", memoryview(b"view")),
    ("ZADD", "q", float("inf"), "m"),
])
def test_the_bytes_are_redis_pys(args: tuple[Any, ...]) -> None:
    assert b"".join(FAST.pack_command(*args)) == b"".join(PLAIN.pack_command(*args))
    assert b"".join(FAST.pack_commands([args, args])) == b"".join(PLAIN.pack_commands([args, args]))


@pytest.mark.parametrize("value", [None, True, object()])
def test_what_redis_py_refuses_is_still_refused_by_it(value: object) -> None:
    with pytest.raises(DataError):
        FAST.pack_command("SET", "k", value)


def test_a_string_that_is_not_utf8_raises_as_before() -> None:
    with pytest.raises(UnicodeEncodeError):
        FAST.pack_command("SET", "k", "bad\udc80")


def test_every_client_the_connector_builds_packs_with_hiredis() -> None:
    for url in ("redis://127.0.0.1:1/0", "redis+sentinel://127.0.0.1:1/cache"):
        connector = RedisConnector(url)
        assert issubclass(connector.pool().connection_class, HiredisPacking)
        assert issubclass(connector.client().connection_pool.connection_class, HiredisPacking)
        store = connector.store_client(max_connections=2, wait=1.0)
        assert issubclass(store.connection_pool.connection_class, HiredisPacking)


def test_a_pool_with_another_codec_is_left_alone() -> None:
    pool = RedisConnector("redis://127.0.0.1:1/0").pool(encoding="latin-1")
    assert not issubclass(pool.connection_class, HiredisPacking)
    assert packed_by_hiredis(pool) is pool


async def test_the_server_reads_what_hiredis_packed(redis_server: RedisServer) -> None:
    client = RedisConnector(redis_server.url).client()
    try:
        await client.set("packing:text", "héllo ☃")
        assert await client.get("packing:text") == "héllo ☃".encode()
        sha = await client.script_load("return {ARGV[1], ARGV[2], ARGV[3]}")
        assert await client.evalsha(sha, 0, 7, 0.25, b"\x00\xff") == [b"7", b"0.25", b"\x00\xff"]
        async with client.pipeline(transaction=True) as pipe:
            replies = await pipe.incrby("packing:n", 5).incrbyfloat("packing:f", 1.5).get("packing:n").execute()
        assert replies == [5, 1.5, b"5"]
        await client.delete("packing:text", "packing:n", "packing:f")
    finally:
        await client.aclose()
