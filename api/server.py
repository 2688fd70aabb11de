"""How ``python -m api`` serves the app: uvicorn's settings, and an HTTP protocol that bounds how
long and how much a client may send before its request's headers are complete.

uvicorn alone leaves three doors open: a connection that never sends a request stays open
forever (its keep-alive timer only starts after a first response); that timer is cancelled by
any byte received, so headers dripped a byte at a time hold a connection indefinitely; and with
httptools an unterminated header is buffered without limit. ``HardenedHttpToolsProtocol`` closes
them while keeping httptools' speed: one timer per request cycle (uvicorn already arms one per
response) and an integer addition per read.
"""

from __future__ import annotations

import asyncio

import uvicorn
from starlette.types import ASGIApp
from uvicorn._types import ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from api.settings import ApiSettings

KEEP_ALIVE = 5  # seconds an idle keep-alive connection is kept (uvicorn's own timer)
GRACEFUL_SHUTDOWN = 30  # seconds open requests and SSE streams get on SIGTERM, then they are cancelled
BACKLOG = 2048  # pending connections the kernel queues for accept() (capped by net.core.somaxconn)


async def headers_too_large(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    """The app for a request whose complete headers are over the limit: 431, then close."""
    await send({"type": "http.response.start", "status": 431,
                "headers": [(b"content-length", b"0"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


class HardenedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline and a size limit on each request's headers.

    The deadline runs from the moment the connection opens, and again from the moment a response
    completes with no request waiting; only a request whose headers are complete cancels it. So
    a silent connection and one dripping its headers are both closed ``header_timeout`` seconds
    after the server started waiting, whatever they send meanwhile. Bodies and long responses
    (SSE streams) are not under this deadline.

    ``_header_bytes`` counts the bytes read since the last request ended. While headers are not
    complete they are all request line and header bytes, so past ``max_header_bytes`` the client
    gets 431 and the connection is closed: what is buffered is bounded by the limit plus one read
    (at most 256 KiB). Headers that complete over the limit within a read are measured exactly
    and answered 431 too; only a request pipelined in the same read as the end of the previous
    one escapes that exact check, and it is still bounded by the read.
    Use ``protocol_class`` to get a subclass with the limits of a settings object.
    """

    header_timeout: float = 15.0
    max_header_bytes: int = 65536

    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes: int = 0
    _awaiting_headers: bool = True

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._header_bytes += len(data)
        super().data_received(data)
        if self._awaiting_headers and self._header_bytes > self.max_header_bytes:
            self._refuse(431)

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._cancel_header_timer()
        # The byte count is an upper bound (it may include the start of the body): only when it
        # is over the limit is the exact size worth computing.
        if self._header_bytes > self.max_header_bytes and self._headers_size() > self.max_header_bytes:
            # Answered by uvicorn's own machinery, which closes the connection after it.
            self.app = headers_too_large
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._awaiting_headers = True
        self._header_bytes = 0

    def on_response_complete(self) -> None:
        idle = not self.pipeline  # a pipelined request already has its headers
        super().on_response_complete()
        if idle and not self.transport.is_closing():
            self._start_header_timer()

    def _unsupported_upgrade_warning(self) -> None:
        pass  # ws="none": an Upgrade request is served as plain HTTP, nothing to warn about

    def _headers_size(self) -> int:
        # The request target plus each "name: value\r\n" line, as they came on the wire.
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def _start_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout, self._header_timeout_expired)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout_expired(self) -> None:
        self._header_timer = None
        if self._awaiting_headers and self._header_bytes:
            self._refuse(408)  # a request had begun: tell a slow but honest client why
        elif not self.transport.is_closing():
            self.transport.close()  # an idle connection: nothing to answer

    def _refuse(self, status: int) -> None:
        """Answer ``status`` with no body and close, without reading more of the connection."""
        if self.transport.is_closing():
            return
        self.logger.info("HTTP %d to %s: request headers too slow or too large", status, self.client)
        head = [STATUS_LINE[status]]
        head.extend(name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers)
        head.append(b"content-length: 0\r\nconnection: close\r\n\r\n")
        self.transport.write(b"".join(head))
        self.transport.close()


def protocol_class(settings: ApiSettings) -> type[HardenedHttpToolsProtocol]:
    """The protocol class for uvicorn's ``http=``, bound to these settings' limits.

    uvicorn instantiates the class itself (with config, server_state, app_state), so the limits
    travel as class attributes of a subclass made for them.
    """

    class Protocol(HardenedHttpToolsProtocol):
        pass

    Protocol.header_timeout = settings.header_timeout
    Protocol.max_header_bytes = settings.max_header_bytes
    return Protocol


def config(app: ASGIApp, settings: ApiSettings) -> uvicorn.Config:
    """uvicorn's configuration for the API; the README's "Serving" section says why each value."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=protocol_class(settings),
        # The API has no WebSocket route: without the upgrade code, it is not attack surface.
        ws="none",
        loop="auto",  # uvloop when installed (uvicorn[standard] installs it), else asyncio
        lifespan="on",  # a failing start-up (lifespan) stops the process instead of serving broken
        server_header=False,  # do not advertise the server software and its version
        date_header=True,  # RFC 9110 §6.6.1: an origin server with a clock sends Date (cached per second)
        # The API logs one structured line per execution itself; uvicorn's line per request
        # would repeat it, unstructured, and costs time on every request.
        access_log=False,
        # uvicorn's records go to the handlers the entry point set up (CARMY_LOG_FORMAT), not
        # to its own text handlers.
        log_config=None,
        log_level="warning",
        timeout_keep_alive=KEEP_ALIVE,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN,
        backlog=BACKLOG,
        # Only used if someone swaps in h11: its bound on a buffered, incomplete request head.
        h11_max_incomplete_event_size=settings.max_header_bytes,
        # limit_concurrency stays off: it counts idle keep-alive connections and SSE streams
        # alike and answers a bare text 503. Admission is CARMY_MAX_PENDING (counted across
        # processes, answered as a carmy/1 error), and idle connections are bounded in time.
    )


def run(app: ASGIApp, settings: ApiSettings) -> None:
    """Serve ``app`` until SIGINT or SIGTERM (exits the process if it cannot start)."""
    uvicorn.Server(config(app, settings)).run()
