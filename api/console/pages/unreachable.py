"""Redis out of reach while a page reads or a button writes: the person is told so on a page of
the console (``503``, through the guard's ``Refused``), not given a bare server error."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import ParamSpec

from redis.exceptions import RedisError
from starlette.responses import Response

from api.console.guard import Refused

log = logging.getLogger("carmy.api")
P = ParamSpec("P")


def told_if_unreachable(handler: Callable[P, Awaitable[Response]]) -> Callable[P, Awaitable[Response]]:
    """``handler``, with a Redis error (or a connection's ``OSError``) refused as a 503 page."""
    @functools.wraps(handler)
    async def run(*args: P.args, **kwargs: P.kwargs) -> Response:
        try:
            return await handler(*args, **kwargs)
        except (RedisError, OSError) as exc:
            log.warning("console: Redis cannot be reached: %s", exc)
            raise Refused(503, "The console cannot reach Redis right now. Try again in a moment.") from exc

    return run
