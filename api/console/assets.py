"""The console's static files (``api/console/static/``), served from memory under
``/console/static/`` with a version in their URL, so a browser may keep each for a year and
still gets the new one after an upgrade. No third-party host: everything a page loads is here."""

from __future__ import annotations

import functools
import hashlib
import mimetypes
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response

STATIC_DIR = Path(__file__).parent / "static"
STATIC_PATH = "/console/static"
# The URL changes with the content (?v=), so a cached copy is never stale.
LONG_CACHE = "public, max-age=31536000, immutable"
TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".svg": "image/svg+xml", ".png": "image/png", ".txt": "text/plain; charset=utf-8"}


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str
    version: str  # the content's digest, short: its URL's ?v= and its ETag


def _load(path: Path) -> Asset:
    body = path.read_bytes()
    media_type = TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return Asset(body=body, media_type=media_type, version=hashlib.sha256(body).hexdigest()[:16])


@functools.cache
def assets() -> dict[str, Asset]:
    """Every file under ``static/`` by its path there, read once per process."""
    return {str(p.relative_to(STATIC_DIR)): _load(p) for p in sorted(STATIC_DIR.rglob("*")) if p.is_file()}


def static_url(name: str) -> str:
    """The versioned URL of ``static/<name>`` (a KeyError for a file that is not there: a typo in a
    template fails its first render, in the tests, not silently in a browser)."""
    return f"{STATIC_PATH}/{name}?v={assets()[name].version}"


def serve(request: Request) -> Response | None:
    """``GET /console/static/{name}``: public (the sign-in page needs its stylesheet), cached for long;
    None when there is no such file."""
    asset = assets().get(request.path_params["name"])
    if asset is None:
        return None
    etag = f'"{asset.version}"'
    headers = {"etag": etag, "cache-control": LONG_CACHE}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)
