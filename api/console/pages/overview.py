"""``/console``, the live overview, and ``/console/live``, the stream that keeps it live.

The page is rendered with the latest frame, so it is useful without JavaScript; ``overview.js``
then opens ``/console/live`` (Server-Sent Events): a ``history`` event with the charts' points
of the last minutes, then a ``frame`` event with each new frame, as the sampler (``live.py``)
encoded it once for every viewer. A stream holds no Redis connection, and ends as soon as its
client goes away (or the sampler stops).

A stream also ends by itself after ``ROTATE_S``, with an ``end`` event, and the page opens the
next one at once: a stopping API process waits for its open responses (up to 30 s) before its
lifespan ends, so a stream that never ended would hold every deploy up while a console is open.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from api.console.figures import FORMATS
from api.console.live import Sampler
from api.console.render import render
from api.endpoints.relay import SSE_HEADERS, until_disconnect
from carmy_worker.loop import first_done, running_loop
from carmy_worker.wire import SSE_KEEPALIVE, sse_frame

FIRST_FRAME_WAIT_S = 2.0  # a page served just after start waits this long for the first reading
KEEPALIVE_S = 15.0  # a comment on a stream with no frame for this long (Redis down): proxies keep it open
# Browsers reconnect an EventSource that ended after this (ms): a restarted API is back within it.
RETRY_MS = 2000
ROTATE_S = 10.0  # a stream's life: what a viewer can hold up the API's shutdown by
END = b"event: end\ndata: {}\n\n"  # the stream ends here: open the next one now


class OverviewPage:
    """The overview's two routes, over the API process's ``Sampler``. ``streams``: open streams."""

    def __init__(self, sampler: Sampler, *, rotate: float = ROTATE_S) -> None:
        self.sampler = sampler
        self.rotate = rotate
        self.streams = 0

    async def get(self, request: Request) -> Response:
        """``GET /console``: the latest frame, server-rendered."""
        frame = await self.sampler.first(FIRST_FRAME_WAIT_S)
        return render(request, "overview.html", frame=frame, workers=frame.workers if frame else [],
                      queues=frame.queues if frame else [], tools=frame.tools if frame else [], **FORMATS)

    async def live(self, request: Request) -> Response:
        """``GET /console/live``: the frames as they come (``text/event-stream``)."""
        return LiveStream(self)


class LiveStream(Response):
    """One viewer's stream: the sampler's history and latest frame at once, then each new frame."""

    def __init__(self, page: OverviewPage) -> None:
        super().__init__()
        self.page = page

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] == "HEAD":  # the stream's head alone, not held for the stream's minutes
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            return await send({"type": "http.response.body", "body": b""})
        sampler, page = self.page.sampler, self.page
        loop = running_loop()
        watching = loop.create_task(until_disconnect(receive))
        ends = loop.time() + page.rotate
        page.streams += 1
        try:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            first = b"retry: %d\n\n" % RETRY_MS + sse_frame("history", sampler.history_json())
            seq = sampler.seq
            if sampler.frame is not None:
                first += sse_frame("frame", sampler.frame_json)
            await _write(send, first)
            while not sampler.closed and loop.time() < ends:
                await first_done(sampler.next_frame(), watching, timeout=min(KEEPALIVE_S, page.rotate))
                if watching.done():
                    return
                if sampler.seq != seq:  # a slow viewer gets the latest frame, and skips those it missed
                    seq = sampler.seq
                    await _write(send, sse_frame("frame", sampler.frame_json))
                else:
                    await _write(send, SSE_KEEPALIVE)
            await send({"type": "http.response.body", "body": END})
        finally:
            page.streams -= 1
            watching.cancel()


async def _write(send: Send, chunk: bytes) -> None:
    await send({"type": "http.response.body", "body": chunk, "more_body": True})
