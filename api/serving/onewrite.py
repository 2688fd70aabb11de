"""One socket write per answer: the head of a response of known length goes out with its body.

uvicorn writes a response's head (status line and headers) as soon as the app sends
``http.response.start``, and its body with the next message: two ``send()`` calls, and on
loopback two packets delivered, for every JSON answer. Under load that second write was a tenth
of the API's CPU (bench/README.md, "API hot path"). ``OneWriteCycle`` holds the head of a
response until its first body message, and writes both at once. A response that announces its
``Content-Length`` sends its body right after its head (Starlette's responses, and ours); a
streamed one (SSE, no length) may not, so its head is held at most to the end of the loop's
turn, then written alone: a stream whose first frame follows its head at once (every SSE answer
of ``api.endpoints.relay``: ``execution.started``) goes out in one write, and a client still sees
any other stream open without waiting for its first chunk.

A held head is written before the transport is closed, so an app that fails between the two
messages still sends the head, then closes, as before.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from carmy_worker.loop import running_loop

if TYPE_CHECKING:  # the type of the method overridden: uvicorn's own, only for the type checker
    from uvicorn._types import ASGISendEvent


class HeldHead:
    """The cycle's view of its transport: a write made while ``hold`` is set waits for the next
    write (or ``flush``, or ``close``) and goes out with it."""

    __slots__ = ("_head", "_transport", "hold")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._head: bytes | None = None
        self.hold = False

    def write(self, data: bytes) -> None:
        if self.hold:
            self.hold = False
            self._head = data
            return
        if self._head is not None:
            data, self._head = self._head + data, None
        self._transport.write(data)

    def flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


class OneWriteCycle(RequestResponseCycle):
    """uvicorn's request-response cycle, with the head of a fixed-length response held for its body.

    ``install`` turns a cycle uvicorn made into one of these (uvicorn builds its cycles itself).
    """

    transport: HeldHead  # type: ignore[assignment]

    @classmethod
    def install(cls, cycle: RequestResponseCycle) -> None:
        cycle.transport = HeldHead(cycle.transport)  # type: ignore[assignment]
        cycle.__class__ = cls

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] != "http.response.start" or self.response_started:
            await super().send(message)
            if self.response_complete:
                self.transport.flush()  # a HEAD answer's body is never written
            return
        transport = self.transport
        transport.hold = True
        try:
            await super().send(message)
        finally:
            transport.hold = False  # the head was refused (an invalid header): hold nothing else
        if not any(name.lower() == b"content-length" for name, _ in message.get("headers", ())):
            running_loop().call_soon(transport.flush)  # a stream: its head waits for this turn's chunk only
