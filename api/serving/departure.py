"""Knowing that a request's client has gone without a task waiting in ``receive()`` for it.

``python -m api`` serves with its own HTTP protocol (``api/serving/server.py``), which sets a request's
``Departure`` as its connection is lost, whatever ended it (a close, a reset, a half-close whose
probe found the client gone, a body too slow). A JSON call then waits for its record, and an SSE
stream for its events, and each for its client's departure, on one future
(``relay.answer_json_unless_gone``, ``relay.stream_sse_unless_gone``), where racing a task that reads
``receive()`` against another that waits for the record cost two tasks and their cancellation
per call (bench/README.md, "Issue 14, the API's JSON answer"). Served by anything else, a
request has no ``Departure``, and the race runs as before.
"""

from __future__ import annotations

from starlette.types import Scope

from carmy_worker.loop import Signal

SCOPE_KEY = "carmy.departure"


class Departure(Signal):
    """Set once the connection a request came on is lost.

    ``body_timeout`` says the server closed it itself, because the request's body did not
    arrive in time (``408 BODY_TIMEOUT`` was sent): the request log says so, not "disconnected".
    """

    body_timeout = False


def of(scope: Scope) -> Departure | None:
    """The request's ``Departure``, if its server keeps one."""
    departure: Departure | None = scope.get(SCOPE_KEY)
    return departure


def install(scope: Scope) -> Departure:
    departure = scope[SCOPE_KEY] = Departure()
    return departure


class Departed(Exception):
    """The client of the call being answered has gone."""
