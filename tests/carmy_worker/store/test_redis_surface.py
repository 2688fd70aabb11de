"""redis-py's private surface, pinned: the store reads its connections' and parsers' private
attributes (and asyncio's ``StreamReader._buffer`` under them), takes replies from hiredis' reader
directly, and overrides the asyncio pools' undocumented hooks. Most of these reads are
``getattr(..., None)``: a release that renamed one would not raise, it would quietly turn a check
off (a stale connection handed out, every reply read through the slow path). So this fails
instead, naming the symbol. ``pyproject.toml`` allows only the releases this passed on."""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import hiredis
import pytest
from redis._parsers import _AsyncRESP2Parser
from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
from redis.asyncio import BlockingConnectionPool, ConnectionPool
from redis.asyncio.connection import AbstractConnection, Connection
from redis.exceptions import NoScriptError, ResponseError

from carmy_worker.store.checkout import QuickCheckout, buffered_reply, is_stale
from carmy_worker.store.packing import HiredisPacking
from carmy_worker.store.pool import StorePool
from tests.pins import assert_tested_release
from tests.support import RedisServer

# Every private or undocumented name of redis-py (and what it holds) the store relies on; the
# comment above each says which of our modules uses it.
SURFACE: dict[str, tuple[str, ...]] = {
    # store/checkout.py, batch.py, pubsub.py and runtime/queue.py: hiredis' "no whole reply yet",
    # as redis-py's parser configures its reader to say it.
    "redis._parsers.hiredis": ("NOT_ENOUGH_DATA", "_AsyncHiredisParser"),
    # store/checkout.py (is_broken, is_stale, buffered_reply) and store/batch.py (_writer: a batch's write).
    "AbstractConnection attributes": ("_parser", "_reader", "_writer", "socket_connect_timeout", "socket_timeout"),
    # store/checkout.py: what a connected connection's stream reader has read and nobody took yet.
    "asyncio.StreamReader attributes": ("_buffer",),
    # store/checkout.py: the reader hiredis' parser feeds (buffered_reply takes replies off it);
    # redis-py's own parser's unparsed bytes.
    "_AsyncHiredisParser attributes": ("_reader",),
    "_AsyncRESP2Parser attributes": ("_buffer",),
    # store/packing.py: HiredisPacking overrides it; pack_commands and send_command go through it.
    "AbstractConnection methods overridden": ("pack_command",),
    # store/packing.py: which connections a pool makes, and with what codec.
    "ConnectionPool attributes": ("connection_class", "connection_kwargs"),
    # store/checkout.py (QuickCheckout) and store/pool.py (StorePool): the pool's hooks.
    "ConnectionPool methods overridden": ("ensure_connection", "get_connection", "release"),
    "ConnectionPool methods called": ("can_get_connection", "get_available_connection"),
    # store/pool.py: StorePool waits up to it, and releases past BlockingConnectionPool's release.
    "BlockingConnectionPool attributes": ("timeout",),
}

SIGNATURES = {
    "AbstractConnection.pack_command": ("(self, *args: Union[bytes, bytearray, memoryview, str, int, float]) "
                                        "-> List[bytes]"),
    "ConnectionPool.ensure_connection": "(self, connection: redis.asyncio.connection.AbstractConnection)",
    "ConnectionPool.get_connection": "(self, command_name=None, *keys, **options)",
    "ConnectionPool.release": "(self, connection: redis.asyncio.connection.AbstractConnection)",
    "ConnectionPool.can_get_connection": "(self) -> bool",
    "ConnectionPool.get_available_connection": "(self)",
}

# Statements of redis-py's source whose meaning our overrides rely on.
STATEMENTS = {
    # QuickCheckout replaces the check every pool runs on a connection it hands out.
    "ConnectionPool.get_connection": ("connection = self.get_available_connection()",
                                      "await self.ensure_connection(connection)"),
    # HiredisPacking: every command redis-py writes is packed by pack_command.
    "AbstractConnection.pack_commands": ("for chunk in self.pack_command(*cmd):",),
    "AbstractConnection.send_command": ("self.pack_command(*args)",),
}

# StorePool.release calls ConnectionPool.release past BlockingConnectionPool's, whose condition it
# replaces with its own waiters: that release must do nothing else.
BLOCKING_RELEASE = ("async with self._condition:", "await super().release(connection)", "self._condition.notify()")

OWNERS = {"AbstractConnection": AbstractConnection, "ConnectionPool": ConnectionPool}


def method(qualified: str) -> Callable[..., Any]:
    owner, name = qualified.split(".")
    found: Callable[..., Any] = getattr(OWNERS[owner], name)
    return found


def code_lines(function: Callable[..., Any]) -> list[str]:
    """The statements of ``function``'s body, docstring and blank lines left out."""
    body = inspect.getsource(function).splitlines()[1:]
    lines = [line.strip() for line in body if line.strip()]
    return [line for line in lines if not line.startswith(('"""', "#"))]


@pytest.mark.parametrize("distribution", ["redis", "hiredis"])
def test_the_release_installed_is_a_tested_one(distribution: str) -> None:
    assert_tested_release(distribution)


def test_every_module_level_name_exists() -> None:
    module = importlib.import_module("redis._parsers.hiredis")
    assert [name for name in SURFACE["redis._parsers.hiredis"] if not hasattr(module, name)] == []


def test_every_method_overridden_or_called_keeps_its_signature() -> None:
    named = [f"AbstractConnection.{name}" for name in SURFACE["AbstractConnection methods overridden"]]
    named += [f"ConnectionPool.{name}" for name in SURFACE["ConnectionPool methods overridden"]
              + SURFACE["ConnectionPool methods called"]]
    assert sorted(named) == sorted(SIGNATURES)
    changed = {name: str(inspect.signature(method(name))) for name in SIGNATURES
               if str(inspect.signature(method(name))) != SIGNATURES[name]}
    assert changed == {}
    # The overrides are ours, and are found first.
    assert "pack_command" in vars(HiredisPacking) and "ensure_connection" in vars(QuickCheckout)
    assert {"get_connection", "release"} <= set(vars(StorePool))
    assert StorePool.__mro__[1:] == (QuickCheckout, BlockingConnectionPool, ConnectionPool, object)


def test_the_statements_the_overrides_rely_on_are_in_redis_py_s_source() -> None:
    missing = {name: [s for s in statements if s not in inspect.getsource(method(name))]
               for name, statements in STATEMENTS.items()}
    assert {name: lines for name, lines in missing.items() if lines} == {}
    assert code_lines(BlockingConnectionPool.release) == list(BLOCKING_RELEASE)
    # BlockingConnectionPool hands out connections itself, with the same check.
    assert "await self.ensure_connection(connection)" in inspect.getsource(BlockingConnectionPool.get_connection)


@pytest.fixture(params=[_AsyncHiredisParser, _AsyncRESP2Parser], ids=["hiredis", "redis-py"])
async def connection(request: pytest.FixtureRequest, redis_server: RedisServer) -> AsyncIterator[Connection]:
    pool = ConnectionPool.from_url(redis_server.url, parser_class=request.param)
    conn = await pool.get_connection()
    yield conn
    await conn.disconnect()
    await pool.aclose()


async def test_every_attribute_we_read_exists_on_a_connected_connection(connection: Connection) -> None:
    missing = [a for a in SURFACE["AbstractConnection attributes"] if not hasattr(connection, a)]
    assert missing == [], f"redis-py's connection has no {missing}"
    assert isinstance(connection._reader, asyncio.StreamReader)
    assert isinstance(connection._writer, asyncio.StreamWriter)
    assert [a for a in SURFACE["asyncio.StreamReader attributes"] if not hasattr(connection._reader, a)] == []
    assert connection._reader._buffer == b""  # type: ignore[attr-defined]
    parser = connection._parser
    expected = SURFACE[f"{type(parser).__name__} attributes"]
    assert [a for a in expected if not hasattr(parser, a)] == [], f"{type(parser).__name__} has no {expected}"
    assert not is_stale(connection)  # an idle connection is not mistaken for one with data left unread
    # And the seconds StorePool tells a timeout by are the ones the connection was made with.
    assert (connection.socket_connect_timeout, connection.socket_timeout) == (None, None)


async def test_the_default_parser_is_hiredis_whose_reader_says_not_enough_data_by_our_sentinel(
        redis_server: RedisServer) -> None:
    """buffered_reply takes replies off hiredis' reader itself: without hiredis as the default
    parser every reply takes the slow path, and without NOT_ENOUGH_DATA it cannot tell none."""
    pool = ConnectionPool.from_url(redis_server.url)
    conn = await pool.get_connection()
    try:
        parser = conn._parser
        assert isinstance(parser, _AsyncHiredisParser)
        assert isinstance(parser._reader, hiredis.Reader)
        assert getattr(parser, "_buffer", None) is None  # is_stale reads it as redis-py's parser's
        assert buffered_reply(conn) is NOT_ENOUGH_DATA
        # An error reply comes back as the exception redis-py would raise (batch.py: NoScriptError).
        parser._reader.feed(b"-NOSCRIPT No matching script.\r\n-ERR bad\r\n+OK\r\n")
        assert isinstance(buffered_reply(conn), NoScriptError)
        assert type(buffered_reply(conn)) is ResponseError
        assert buffered_reply(conn) == b"OK"
        assert buffered_reply(conn) is NOT_ENOUGH_DATA
    finally:
        await conn.disconnect()
        await pool.aclose()


def test_a_blocking_pool_keeps_its_timeout_and_a_pool_its_connection_settings() -> None:
    pool = BlockingConnectionPool(max_connections=2, timeout=3, socket_timeout=4)
    assert [a for a in SURFACE["BlockingConnectionPool attributes"] if not hasattr(pool, a)] == []
    assert [a for a in SURFACE["ConnectionPool attributes"] if not hasattr(pool, a)] == []
    assert (pool.timeout, pool.connection_class, pool.connection_kwargs) == (3, Connection, {"socket_timeout": 4})
