"""How ``python -m api`` serves the app: uvicorn's settings, and an HTTP protocol that bounds how
long and how much a client may send before its request is complete.

uvicorn alone leaves four doors open: a connection that never sends a request stays open
forever (its keep-alive timer only starts after a first response); that timer is cancelled by
any byte received, so headers dripped a byte at a time hold a connection indefinitely; with
httptools an unterminated header is buffered without limit; and a body has no deadline at all,
so a client that announces a length and stalls holds its connection and the request's handler
for as long as it likes. ``HardenedHttpToolsProtocol`` closes them while keeping httptools'
speed: one timer per request cycle (uvicorn already arms one per response), a second only for a
body that does not arrive with its headers, and an integer addition per read.

The body deadline lives here rather than in ASGI middleware because this layer sees every
request before any route runs, knows exactly when the headers ended and the body completed (the
parser's callbacks), and can answer and close the connection even while the app waits in
``receive()``; a middleware could only time each ``receive()`` call, at the cost of a timeout
per call on every request.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, cast

import httptools
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from api.serving import departure
from api.serving.halfclose import ResetProbe
from api.serving.onewrite import OneWriteCycle
from api.serving.stopping import ANSWER_BEFORE_S, GRACEFUL_SHUTDOWN, grace_ends
from api.settings import ApiSettings
from carmy_worker import collector, heap
from carmy_worker.sdk.errors import error
from carmy_worker.wire import EnvelopeError, json_encoder

KEEP_ALIVE = 5  # seconds an idle keep-alive connection is kept (uvicorn's own timer)
BACKLOG = 2048  # pending connections the kernel queues for accept() (capped by net.core.somaxconn)


async def headers_too_large(scope: Scope, receive: Receive, send: Send) -> None:
    """The app for a request whose complete headers are over the limit: 431, then close."""
    await send({"type": "http.response.start", "status": 431,
                "headers": [(b"content-length", b"0"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def body_timeout_answer(seconds: float) -> bytes:
    """The head lines after the status line, and the body, of the 408 for a body too slow."""
    body = json_encoder.encode(EnvelopeError(error(
        "BODY_TIMEOUT", f"The request body did not arrive within {seconds:g} s of its headers.")))
    return (b"content-type: application/json\r\ncache-control: no-store\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (len(body), body))


class HardenedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline and a size limit on each request's headers,
    and a deadline on its body.

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

    A FIN after a complete request whose answer has not begun is taken for a half-close, not a
    hang-up: the connection stays open for the answer while ``ResetProbe`` checks that the
    client is still there (``api/serving/halfclose.py`` says why and how). Any other FIN is a disconnect,
    as in uvicorn.

    The body deadline runs from the end of the headers to the end of the body, whatever arrives
    meanwhile, so a body dripped a byte at a time is cut off like a stalled one. The timer is
    armed only once a read leaves the body incomplete: a request that arrives whole costs
    nothing. A client that misses it gets ``408 BODY_TIMEOUT`` and the connection is closed; the
    app's ``receive()`` reports a disconnect, so nothing is recorded and no slot is held.
    Use ``protocol_class`` to get a subclass with the limits of a settings object.
    """

    header_timeout: float = 15.0
    max_header_bytes: int = 65536
    body_timeout: float = 30.0
    body_timeout_answer: bytes = body_timeout_answer(30.0)

    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes: int = 0
    _awaiting_headers: bool = True
    _body_timer: asyncio.TimerHandle | None = None
    _body_deadline: float = 0.0  # loop time by which the current request's body must be complete
    _reading_body: bool = False
    _probe: ResetProbe | None = None  # set once the client has half-closed

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        self._cancel_body_timer()
        if self._probe is not None:
            self._probe.cancel()
        super().connection_lost(exc)
        if self.cycle is not None and not self.cycle.response_complete:
            gone = departure.of(cast("dict[str, Any]", self.cycle.scope))
            if gone is not None:
                gone.set()

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio.Protocol allows a bool
        """True keeps the connection open to answer a client that only shut down its sending side."""
        if self._probe is not None:
            return True  # already half-closed (a loop may report the end of input again)
        cycle, sock = self.cycle, self.transport.get_extra_info("socket")
        if (cycle is None or cycle.response_started or self._reading_body or self.pipeline or sock is None
                or self.scope["http_version"] == "1.0"  # a 1.0 client may not be sent the probe (RFC 9110 15.2)
                or self.scheme == "https"):  # TLS transports close on a FIN whatever this returns
            return None  # the transport closes: a request in flight sees a disconnect
        cycle.keep_alive = False  # nothing more can come: close once answered
        cycle.waiting_for_100_continue = False  # the probe is this request's interim response
        self._probe = ResetProbe(self.loop, self.transport, sock, on_reset=self.transport.abort)
        self._probe.start()
        return True

    def data_received(self, data: bytes) -> None:
        self._header_bytes += len(data)
        super().data_received(data)
        if self._awaiting_headers and self._header_bytes > self.max_header_bytes:
            self._refuse(431)
        elif self._reading_body and self._body_timer is None and not self.transport.is_closing():
            self._body_timer = self.loop.call_at(self._body_deadline, self._body_timeout_expired)

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._reading_body = True
        self._body_deadline = self.loop.time() + self.body_timeout
        self._cancel_header_timer()
        # The byte count is an upper bound (it may include the start of the body): only when it
        # is over the limit is the exact size worth computing.
        if self._header_bytes > self.max_header_bytes and self._headers_size() > self.max_header_bytes:
            # Answered by uvicorn's own machinery, which closes the connection after it.
            self.app = headers_too_large
        if self.url[:1] != b"/":
            self._host_from_target()
        previous = self.cycle
        super().on_headers_complete()
        if self.cycle is not previous:  # not an upgrade: a request to answer
            OneWriteCycle.install(self.cycle)
            departure.install(cast("dict[str, Any]", self.cycle.scope))

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._awaiting_headers = True
        self._header_bytes = 0
        self._reading_body = False
        self._cancel_body_timer()

    def on_response_complete(self) -> None:
        idle = not self.pipeline  # a pipelined request already has its headers
        super().on_response_complete()
        if idle and not self.transport.is_closing():
            self._start_header_timer()

    def _host_from_target(self) -> None:
        """An absolute-form target (``GET http://example.com/path``) names the host it is for, and
        RFC 9112 §3.2.2 has the server ignore ``Host`` then: uvicorn keeps only its path, so the
        target's authority replaces the ``Host`` header, and the Host check (``api/guards/browser.py``)
        judges the name the request was really sent to."""
        if b"://" not in self.url:
            return  # "*" (OPTIONS) or an authority-form CONNECT target: nothing to replace
        try:
            target = httptools.parse_url(self.url)
        except httptools.HttpParserInvalidURLError:
            return  # uvicorn refuses the target itself (400)
        host = target.host or b""
        if b":" in host:
            host = b"[" + host + b"]"  # an IPv6 literal
        if target.port is not None:
            host += b":%d" % target.port
        self.headers[:] = [(name, value) for name, value in self.headers if name != b"host"]
        self.headers.append((b"host", host))

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

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_timeout_expired(self) -> None:
        self._body_timer = None
        if not self._reading_body or self.transport.is_closing():
            return
        if self.pipeline or self.flow.read_paused:
            # The stall is ours: reading waits for the app to take what came, or for an earlier
            # response to end. The client gets its full time again once reading resumes.
            self._body_timer = self.loop.call_later(self.body_timeout, self._body_timeout_expired)
            return
        cycle = self.cycle
        if cycle.response_complete:  # answered without its body (401, 413, 415): nothing to say
            self.transport.close()
            return
        if not cycle.response_started:
            self._refuse(408, self.body_timeout_answer, "request body too slow")
            gone = departure.of(cast("dict[str, Any]", cycle.scope))
            if gone is not None:
                gone.body_timeout = True  # the handler logs a 408, not a client that left
        # The handler waiting in receive() learns the client is gone, and whatever it sends now
        # is dropped: nothing is recorded for a request that never arrived whole.
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.close()

    def _refuse(self, status: int, rest: bytes = b"content-length: 0\r\nconnection: close\r\n\r\n",
                why: str = "request headers too slow or too large") -> None:
        """Answer ``status`` (``rest``: the head after the status line, and the body) and close,
        without reading more of the connection."""
        if self.transport.is_closing():
            return
        self.logger.info("HTTP %d to %s: %s", status, self.client, why)
        head = [STATUS_LINE[status]]
        head.extend(name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers)
        head.append(rest)
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
    Protocol.body_timeout = settings.body_timeout
    Protocol.body_timeout_answer = body_timeout_answer(settings.body_timeout)
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
        # Nothing in the app reads the client's address or the scheme from the scope, which is
        # all X-Forwarded-For/-Proto would change: uvicorn's middleware for them (on by default,
        # for a proxy on 127.0.0.1) only cost a pass over every request's headers.
        proxy_headers=False,
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


class Server(uvicorn.Server):
    """uvicorn's server, with the garbage collector set for a serving process
    (``carmy_worker.collector``): what start-up built is frozen once the app has started. On
    SIGTERM, what still waits for an execution's outcome answers before the grace ends."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        collector.freeze_start_up()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # The requests still waiting for an outcome answer before uvicorn cancels them at the end
        # of GRACEFUL_SHUTDOWN (api.serving.stopping); those that end sooner let it stop sooner.
        timer = asyncio.get_running_loop().call_later(GRACEFUL_SHUTDOWN - ANSWER_BEFORE_S, grace_ends)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def run(app: ASGIApp, settings: ApiSettings) -> None:
    """Serve ``app`` until SIGINT or SIGTERM (exits the process if it cannot start)."""
    collector.for_serving()
    heap.keep_freed_memory()
    Server(config(app, settings)).run()
