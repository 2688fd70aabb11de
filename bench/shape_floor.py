"""The least the design's shape costs a call at one client: HTTP in, Redis to a worker process,
Redis back, HTTP out, with nothing in between.

Carmy's call crosses six process boundaries (wrk → API → Redis → worker → Redis → API → wrk);
a bare Starlette endpoint, two. This module runs that shape with no work at each step, so that
what is left of Carmy's time is seen beside it (bench/README.md, "Issue 35, the shape's floor"):

* ``app``: a raw ASGI app (no framework) under uvicorn, as ``python -m api`` runs. For each
  ``POST /agent/execute`` it writes ``LPUSH`` of a token on one connection and waits for that
  token on a pub/sub connection, then answers ``{"status":"completed","data":{}}``. Its Redis
  connections are asyncio protocols parsing with hiredis (no redis-py above them): a lone call
  through redis-py's client costs more than the floor is meant to show.
* ``python -m bench.shape_floor serve URL``: the worker, a blocking socket: ``BLPOP`` the token,
  then ``PUBLISH`` it back written together with the next ``BLPOP`` (as Carmy's worker writes its
  next wait with a SETTLE).

No scripts run: Carmy's three (SUBMIT, LEASE, SETTLE) add Redis's time inside them, which
``INFO commandstats`` gives (bench/README.md says how much).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import sys
from typing import Any
from urllib.parse import urlsplit

import hiredis

REQUESTS = b"bench:shape:requests"
REPLIES = b"bench:shape:replies"
STOP = b"stop"
READY = "shape floor worker ready"

_ANSWER = b'{"status":"completed","data":{}}'
_HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(_ANSWER)).encode())]


def command(*parts: bytes) -> bytes:
    """One command in Redis's protocol (RESP)."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 6379


class _Replies(asyncio.Protocol):
    """A Redis connection whose replies (or pushed messages) go to ``on_reply`` as parsed."""

    def __init__(self, on_reply: Any) -> None:
        self._reader = hiredis.Reader()
        self._on_reply = on_reply
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP connection's

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            self._on_reply(reply)


class _Shape:
    """The app's two Redis connections and the calls waiting for their tokens."""

    def __init__(self) -> None:
        self.waiting: dict[bytes, asyncio.Future[None]] = {}
        self.tokens = itertools.count()
        self.commands: asyncio.Transport | None = None
        self.subscriber: asyncio.Transport | None = None
        self.subscribed: asyncio.Future[None] | None = None

    async def connect(self, url: str) -> None:
        loop = asyncio.get_running_loop()
        host, port = _address(url)
        self.subscribed = loop.create_future()
        sub, _ = await loop.create_connection(lambda: _Replies(self._pushed), host, port)
        self.subscriber = sub
        sub.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sub.write(command(b"SUBSCRIBE", REPLIES))
        await self.subscribed
        # LPUSH's replies are read and dropped: the call waits for its token to come back.
        self.commands, _ = await loop.create_connection(lambda: _Replies(lambda _: None), host, port)
        self.commands.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        for transport in (self.commands, self.subscriber):
            if transport is not None:
                transport.close()

    def _pushed(self, message: list[bytes]) -> None:
        if message[0] == b"subscribe":
            if self.subscribed is not None and not self.subscribed.done():
                self.subscribed.set_result(None)
            return
        future = self.waiting.pop(message[2], None)
        if future is not None and not future.done():
            future.set_result(None)

    async def call(self) -> None:
        token = b"%d" % next(self.tokens)
        future = asyncio.get_running_loop().create_future()
        self.waiting[token] = future
        assert self.commands is not None
        self.commands.write(command(b"LPUSH", REQUESTS, token))
        try:
            await future
        finally:
            self.waiting.pop(token, None)


_shape = _Shape()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI app: ``POST /agent/execute`` through the worker; ``GET /health``."""
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            if message["type"] == "lifespan.startup":
                await _shape.connect(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
                await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    more = True
    while more:  # the request's body, read and dropped, as any endpoint must
        message = await receive()
        more = message.get("more_body", False)
    if scope["path"] == "/agent/execute":
        await _shape.call()
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": _ANSWER})


def serve(url: str) -> None:
    """The worker: pop each token and publish it back (with the next wait), until told to stop."""
    sock = socket.create_connection(_address(url))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = hiredis.Reader()

    def reply() -> Any:
        while (got := reader.gets()) is False:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("Redis closed the connection")
            reader.feed(data)
        return got

    wait = command(b"BLPOP", REQUESTS, b"0")
    sock.sendall(wait)
    print(READY, flush=True)
    while True:
        _, token = reply()
        if token == STOP:
            return
        sock.sendall(command(b"PUBLISH", REPLIES, token) + wait)
        reply()  # PUBLISH's count


def stop(url: str) -> None:
    """Tell the worker to stop."""
    with socket.create_connection(_address(url)) as sock:
        sock.sendall(command(b"LPUSH", REQUESTS, STOP))
        sock.recv(64)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit("usage: python -m bench.shape_floor serve REDIS_URL")
