"""Reading a request body with a hard limit, whether or not it announces its length."""

from __future__ import annotations

from starlette.types import Receive, Scope

from api.http.fields import fields


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    pass


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole body, or ``BodyTooLarge`` as soon as it is known to exceed ``limit`` bytes."""
    length = fields(scope).get(b"content-length")
    if length is not None:
        try:
            if int(length) > limit:
                raise BodyTooLarge
        except ValueError:
            pass  # the server rejects malformed lengths before we see them
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
