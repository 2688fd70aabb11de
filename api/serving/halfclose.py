"""Telling a client that half-closed its connection from one that went away.

A FIN says only that the client will send nothing more. ``shutdown(SHUT_WR)`` after a complete
request sends one (``nc -N``, socat, TCP tunnels that forward half-closes), and so does
``close()``: on the wire they are the same. uvicorn takes every FIN for a disconnect (its
``eof_received`` lets the transport close), so a client that half-closes had its execution
cancelled and never saw an answer; HAProxy, by default, takes a closed input for a possible
half-close instead ("HTTP compliant" in its words; ``option abortonclose`` aborts). Carmy must
also notice a real hang-up at once, since that cancels the execution. The two can only be told
apart by writing: data sent to a socket its owner has closed is answered with a reset, while a
half-closed socket takes it.

So ``ResetProbe`` writes ``100 Continue``, an interim response every HTTP/1.1 client must accept
before the final one (the only one Python's http.client skips), and then reads the socket's
error a few times over two seconds, far longer than a round trip: a reset is a disconnect; none
means the client is listening and gets its answer. One probe only: a client that half-closes
and later leaves is noticed when its answer is written, and its execution runs to the end.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator

PROBE = b"HTTP/1.1 100 Continue\r\n\r\n"
# Seconds before each look at the socket, about two in all: a reset comes back within a round
# trip, which on loopback is over before the next turn of the loop.
CHECKS = (0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.25, 0.25, 0.25, 0.5, 0.5)


class ResetProbe:
    """Writes ``PROBE`` on ``transport`` and calls ``on_reset`` if the peer answers it with a reset."""

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: asyncio.Transport, sock: socket.socket,
                 on_reset: Callable[[], None]) -> None:
        self._loop = loop
        self._transport = transport
        self._sock = sock
        self._on_reset = on_reset
        self._delays: Iterator[float] = iter(CHECKS)
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._transport.write(PROBE)
        self._next()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _next(self) -> None:
        delay = next(self._delays, None)
        self._timer = None if delay is None else self._loop.call_later(delay, self._check)

    def _check(self) -> None:
        self._timer = None
        if self._transport.is_closing():
            return
        try:
            reset = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0
        except OSError:
            reset = True
        if reset:
            self._on_reset()
        else:
            self._next()
