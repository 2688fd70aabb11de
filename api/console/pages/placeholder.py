"""``/console`` until the live overview's page (``pages/overview.py``) replaces this route."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from api.console.render import render


async def overview(request: Request) -> Response:
    return render(request, "placeholder.html")
