"""Commands packed into Redis's protocol by hiredis (C) instead of by redis-py.

redis-py's asyncio connections pack every command in pure Python (its synchronous ones already
use hiredis's packer): under load that was a tenth of a worker's CPU and a twentieth of the
API's, for the same bytes. ``hiredis.pack_command`` writes exactly what redis-py's
``pack_command`` would for the arguments we send (``str`` as UTF-8, ``bytes``, ``int``,
``float`` as ``repr``); anything else it refuses (``None``, ``bool``, other objects, a string
that is not UTF-8) goes to redis-py's own packer, which raises the error it always raised.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio.connection import AbstractConnection, ConnectionPool

_classes: dict[type[AbstractConnection], type[AbstractConnection]] = {}


class HiredisPacking(AbstractConnection):
    """Mixed in before a redis-py asyncio connection class: its ``pack_command`` in C."""

    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]
        # As redis-py does: a command name given with its subcommand ("SCRIPT LOAD") is two words.
        if isinstance(first, str | bytes) and len(words := first.split()) > 1:
            args = (*words, *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except (TypeError, UnicodeError):
            return super().pack_command(*args)


def packed_by_hiredis(pool: ConnectionPool) -> ConnectionPool:
    """``pool``, making connections that pack with hiredis (before it has made any). A pool whose
    connections encode with another codec than strict UTF-8 is left as it is."""
    options = pool.connection_kwargs
    if options.get("encoding", "utf-8").lower().replace("-", "") != "utf8" or \
            options.get("encoding_errors", "strict") != "strict":
        return pool
    base = pool.connection_class
    if not issubclass(base, HiredisPacking):
        if base not in _classes:
            _classes[base] = type(f"Hiredis{base.__name__}", (HiredisPacking, base), {})
        pool.connection_class = _classes[base]
    return pool
